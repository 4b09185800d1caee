// Package leadership runs a controller's work only while this Pod holds its fencedlease
// grant (docs/go.md): a controller-runtime manager.Runnable gate that starts the runnables
// it holds once the grant is held and stops them at once when the grant is lost (or
// expires) or on the first fence denial that says another Pod leads, and a gauge like
// client-go's leader_election_master_status.
package leadership

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencedlease/fencedlease/go/fenced"
	"github.com/fencedlease/fencedlease/go/grant"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	leaderStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencedlease_leader_status",
		Help: "1 while this process runs its gated controllers under a held fencedlease grant, else 0 (like client-go's leader_election_master_status).",
	}, []string{"name"})
	denials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencedlease_fence_denials_total",
		Help: "Writes of this process the fence refused, by code.",
	}, []string{"name", "code"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(leaderStatus, denials)
}

// ErrNotLeading is what Start returns when it stopped the gated runnables because leadership
// ended (the manager then stops: controller-runtime controllers cannot start twice, so the
// process exits and its Pod restarts as a candidate, as with client-go leader election).
var ErrNotLeading = errors.New("fencedlease: leadership lost")

// LostError says why leadership ended: Grant is the grant error (lost, expired, absent,
// malformed), or Denial the fence denial that showed another Pod leads.
type LostError struct {
	Grant  error
	Denial *fenced.Denial
}

func (e *LostError) Error() string {
	if e.Denial != nil {
		return fmt.Sprintf("fencedlease: leadership lost: the fence refused a write (%s): %v", e.Denial.Code, e.Denial)
	}
	return fmt.Sprintf("fencedlease: leadership lost: %v", e.Grant)
}

// Is makes errors.Is(err, ErrNotLeading) true.
func (e *LostError) Is(target error) bool { return target == ErrNotLeading }

// Unwrap returns the cause.
func (e *LostError) Unwrap() error {
	if e.Denial != nil {
		return e.Denial
	}
	return e.Grant
}

// stopsLeading: the codes that say another Pod leads, or this token is no good.
func stopsLeading(code string) bool {
	switch code {
	case fenced.CodeStaleFence, fenced.CodeHolderMismatch, fenced.CodeUnknownToken, fenced.CodeLeaseMismatch:
		return true
	}
	return false
}

// Gate holds runnables and runs them only while the grant is held. It is itself a
// manager.Runnable (add it to the manager), or call Start yourself without controller-runtime.
type Gate struct {
	src   grant.Source
	name  string
	every time.Duration

	mu        sync.Mutex
	held      []manager.Runnable
	running   context.Context // set while leading: runnables added then start at once
	spawn     func(manager.Runnable)
	denied    chan *fenced.Denial
	isLeading bool
}

// Option configures a Gate.
type Option func(*Gate)

// WithName labels the metrics (default "default").
func WithName(name string) Option { return func(g *Gate) { g.name = name } }

// WithCheckInterval is how often the grant is re-checked while waiting and leading (default
// 200ms; a watched grant.Dir is read from memory, and its changes are seen at once).
func WithCheckInterval(d time.Duration) Option { return func(g *Gate) { g.every = d } }

// NewGate makes a gate on the grant src gives.
func NewGate(src grant.Source, opts ...Option) *Gate {
	g := &Gate{src: src, name: "default", every: 200 * time.Millisecond, denied: make(chan *fenced.Denial, 1)}
	for _, opt := range opts {
		opt(g)
	}
	leaderStatus.WithLabelValues(g.name).Set(0)
	return g
}

// Add puts r under the gate: started when the grant is held (at once if it is already).
func (g *Gate) Add(r manager.Runnable) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = append(g.held, r)
	if g.running != nil {
		g.spawn(r)
	}
}

// Deny tells the gate about a fence denial (pass it to fenced.WithDenialHandler): one that
// says another Pod leads stops the gated runnables.
func (g *Gate) Deny(d *fenced.Denial) {
	denials.WithLabelValues(g.name, d.Code).Inc()
	if !stopsLeading(d.Code) {
		return
	}
	select {
	case g.denied <- d:
	default:
	}
}

// Leading reports whether the gated runnables are running.
func (g *Gate) Leading() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.isLeading
}

// NeedLeaderElection is true: with the manager's own (client-go) leader election on, the
// gate waits for it too; with it off, the manager starts the gate at once.
func (g *Gate) NeedLeaderElection() bool { return true }

type notifier interface {
	Changed() (<-chan struct{}, func())
}

// Start waits for a held grant, runs the gated runnables, and stops them when ctx ends
// (returns nil), when the grant is no longer held or a denial says another Pod leads
// (returns a *LostError, errors.Is ErrNotLeading), or when one of them fails (returns its
// error). It returns after every gated runnable returned.
func (g *Gate) Start(ctx context.Context) error {
	var changed <-chan struct{}
	if n, ok := g.src.(notifier); ok {
		ch, stop := n.Changed()
		defer stop()
		changed = ch
	}
	ticker := time.NewTicker(g.every)
	defer ticker.Stop()
	for { // wait for the grant
		if _, err := g.src.Current(); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-ticker.C:
		}
	}
	select { // a denial from before we led is not about this grant
	case <-g.denied:
	default:
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	failed := make(chan error, 1)
	g.mu.Lock()
	g.running = runCtx
	g.spawn = func(r manager.Runnable) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Start(runCtx); err != nil {
				select {
				case failed <- err:
				default:
				}
			}
		}()
	}
	for _, r := range g.held {
		g.spawn(r)
	}
	g.isLeading = true
	g.mu.Unlock()
	leaderStatus.WithLabelValues(g.name).Set(1)

	result := g.lead(ctx, changed, ticker.C, failed)

	g.mu.Lock()
	g.running, g.spawn, g.isLeading = nil, nil, false
	g.mu.Unlock()
	leaderStatus.WithLabelValues(g.name).Set(0)
	cancel()
	wg.Wait()
	return result
}

func (g *Gate) lead(ctx context.Context, changed <-chan struct{}, tick <-chan time.Time, failed <-chan error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case d := <-g.denied:
			return &LostError{Denial: d}
		case <-changed:
		case <-tick:
		}
		if _, err := g.src.Current(); err != nil {
			return &LostError{Grant: err}
		}
	}
}
