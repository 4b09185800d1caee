package leadership

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencedlease/fencedlease/go/fenced"
	"github.com/fencedlease/fencedlease/go/grant"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

type source struct {
	mu  sync.Mutex
	err error
}

func (s *source) set(err error)    { s.mu.Lock(); s.err = err; s.mu.Unlock() }
func (s *source) Describe() string { return "test" }
func (s *source) Current() (grant.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return grant.Grant{}, s.err
	}
	return grant.Grant{Token: 3, LeaseID: "g", State: "held", ValidUntil: time.Now().Add(time.Hour)}, nil
}

var absent = &grant.Error{Kind: grant.KindAbsent, Msg: "nothing granted"}

// controller records that it ran and returns when its context ends.
type controller struct {
	started, stopped atomic.Int32
	running          chan struct{}
}

func newController() *controller { return &controller{running: make(chan struct{}, 4)} }

func (c *controller) Start(ctx context.Context) error {
	c.started.Add(1)
	c.running <- struct{}{}
	<-ctx.Done()
	c.stopped.Add(1)
	return nil
}

func startGate(t *testing.T, g *Gate) (context.CancelFunc, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Start(ctx) }()
	t.Cleanup(cancel)
	return cancel, done
}

func within(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not within 5s", what)
	}
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the gate did not return within 5s")
		return nil
	}
}

func gauge(name string) float64 { return testutil.ToFloat64(leaderStatus.WithLabelValues(name)) }

func TestControllersStartOnlyOnceTheGrantIsHeldAndStopWhenItIsLost(t *testing.T) {
	src := &source{err: absent}
	g := NewGate(src, WithName("t1"), WithCheckInterval(5*time.Millisecond))
	c := newController()
	g.Add(c)
	_, done := startGate(t, g)
	time.Sleep(50 * time.Millisecond) // a bounded look: nothing may start while absent
	if c.started.Load() != 0 || g.Leading() || gauge("t1") != 0 {
		t.Fatal("started without a grant")
	}
	src.set(nil)
	within(t, "start once held", c.running)
	if !g.Leading() || gauge("t1") != 1 {
		t.Fatal("not leading")
	}
	src.set(&grant.Error{Kind: grant.KindLost, Msg: "lost"})
	err := result(t, done)
	var lost *LostError
	if !errors.Is(err, ErrNotLeading) || !errors.As(err, &lost) || !grant.IsLost(lost.Grant) {
		t.Fatalf("%v", err)
	}
	if c.stopped.Load() != 1 || g.Leading() || gauge("t1") != 0 {
		t.Fatal("the controller was not stopped before Start returned")
	}
}

func TestAnExpiredGrantStopsToo(t *testing.T) {
	src := &source{}
	g := NewGate(src, WithName("t2"), WithCheckInterval(5*time.Millisecond))
	c := newController()
	g.Add(c)
	_, done := startGate(t, g)
	within(t, "start", c.running)
	src.set(&grant.Error{Kind: grant.KindExpired, Msg: "expired"})
	if err := result(t, done); !errors.Is(err, grant.ErrExpired) || !errors.Is(err, ErrNotLeading) {
		t.Fatalf("%v", err)
	}
}

func denial(code string, http int32) *fenced.Denial {
	d, ok := fenced.AsDenial(&apierrors.StatusError{ErrStatus: metav1.Status{Code: http,
		Message: `admission webhook "fence.fencedlease.io" denied the request: ` + code + `: x`}})
	if !ok {
		panic(code)
	}
	return d
}

func TestTheFirstDenialThatSaysAnotherLeadsStopsAtOnce(t *testing.T) {
	for _, code := range []string{fenced.CodeStaleFence, fenced.CodeHolderMismatch, fenced.CodeUnknownToken, fenced.CodeLeaseMismatch} {
		src := &source{}
		g := NewGate(src, WithName("t3"), WithCheckInterval(time.Hour)) // the denial alone stops it
		c := newController()
		g.Add(c)
		_, done := startGate(t, g)
		within(t, "start", c.running)
		before := testutil.ToFloat64(denials.WithLabelValues("t3", code))
		g.Deny(denial(code, 403))
		err := result(t, done)
		var lost *LostError
		if !errors.As(err, &lost) || lost.Denial == nil || lost.Denial.Code != code || c.stopped.Load() != 1 {
			t.Fatalf("%s: %v", code, err)
		}
		if testutil.ToFloat64(denials.WithLabelValues("t3", code)) != before+1 {
			t.Errorf("%s not counted", code)
		}
	}
}

func TestOtherDenialsDoNotStop(t *testing.T) {
	src := &source{}
	g := NewGate(src, WithName("t4"), WithCheckInterval(5*time.Millisecond))
	c := newController()
	g.Add(c)
	cancel, done := startGate(t, g)
	within(t, "start", c.running)
	g.Deny(denial(fenced.CodeUnavailable, 503))
	g.Deny(denial(fenced.CodeDuplicate, 403))
	g.Deny(denial(fenced.CodeInvalid, 422))
	time.Sleep(30 * time.Millisecond)
	if !g.Leading() {
		t.Fatal("stopped on a denial that does not say another Pod leads")
	}
	cancel()
	if err := result(t, done); err != nil {
		t.Fatalf("a manager shutting down: %v", err)
	}
}

type failing struct{}

func (failing) Start(context.Context) error { return errors.New("boom") }

func TestARunnablesFailureStopsTheOthers(t *testing.T) {
	g := NewGate(&source{}, WithName("t5"), WithCheckInterval(time.Hour))
	c := newController()
	g.Add(c)
	g.Add(failing{})
	_, done := startGate(t, g)
	if err := result(t, done); err == nil || err.Error() != "boom" || c.stopped.Load() != c.started.Load() {
		t.Fatalf("%v", err)
	}
}

func TestARunnableAddedWhileLeadingStartsAtOnce(t *testing.T) {
	g := NewGate(&source{}, WithName("t6"), WithCheckInterval(5*time.Millisecond))
	first := newController()
	g.Add(first)
	cancel, done := startGate(t, g)
	within(t, "first", first.running)
	late := newController()
	g.Add(late)
	within(t, "late", late.running)
	cancel()
	if err := result(t, done); err != nil || late.stopped.Load() != 1 {
		t.Fatalf("%v", err)
	}
}

// fakeManager records what Wrap and Manager.Add add to it.
type fakeManager struct {
	manager.Manager
	added []manager.Runnable
}

func (m *fakeManager) Add(r manager.Runnable) error { m.added = append(m.added, r); return nil }

type noLeader struct{ controller }

func (*noLeader) NeedLeaderElection() bool { return false }

func TestManagerGatesControllersAndPassesTheRest(t *testing.T) {
	fm := &fakeManager{}
	g := NewGate(&source{}, WithName("t7"))
	m := &Manager{Manager: fm, Gate: g}
	c := newController()
	if err := m.Add(c); err != nil {
		t.Fatal(err)
	}
	webhookLike := &noLeader{}
	if err := m.Add(webhookLike); err != nil {
		t.Fatal(err)
	}
	if len(g.held) != 1 || g.held[0] != manager.Runnable(c) || len(fm.added) != 1 || fm.added[0] != manager.Runnable(webhookLike) {
		t.Fatalf("gated %v, passed %v", g.held, fm.added)
	}
	if !g.NeedLeaderElection() {
		t.Error("the gate waits for the manager's own election when it has one")
	}
}
