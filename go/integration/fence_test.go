package integration

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fencedlease/fencedlease/go/fenced"
	"github.com/fencedlease/fencedlease/go/grant"
	"github.com/fencedlease/fencedlease/go/leadership"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// setup reads the environment the pytest test gives: the step to run, the kubeconfig, the
// namespace (FencedLease "ctl", a FencePolicy declaring configmaps) and the grant directory.
func setup(t *testing.T, step string) (context.Context, *rest.Config, string, *grant.Dir) {
	t.Helper()
	if os.Getenv("FENCEDLEASE_GO_IT") != step {
		t.Skipf("FENCEDLEASE_GO_IT is not %q (run by tests/integration/test_go_client.py)", step)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx, cfg, os.Getenv("FENCEDLEASE_GO_IT_NAMESPACE"), grant.NewDir(os.Getenv("FENCEDLEASE_GO_IT_GRANT_DIR"), grant.WithLease("ctl"))
}

func configMap(ns, name, owner string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{fenced.LeaseLabel: "ctl"}},
		Data:       map[string]string{"owner": owner},
	}
}

// TestHolder: the holder's create, update, merge patch and fenced delete are admitted, each
// stamped with its token.
func TestHolder(t *testing.T) {
	ctx, cfg, ns, src := setup(t, "holder")
	g, err := src.Current()
	if err != nil {
		t.Fatalf("the grant: %v", err)
	}
	base, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := fenced.Wrap(base, src)
	cm := configMap(ns, "cfg", "go-a")
	if err := c.Create(ctx, cm); err != nil {
		t.Fatalf("create: %v", err)
	}
	cm.Data["owner"] = "go-a-update"
	if err := c.Update(ctx, cm); err != nil {
		t.Fatalf("update: %v", err)
	}
	before := cm.DeepCopy()
	cm.Data["owner"] = "go-a"
	if err := c.Patch(ctx, cm, client.MergeFrom(before)); err != nil {
		t.Fatalf("patch: %v", err)
	}
	if got := cm.Annotations[fenced.TokenAnnotation]; got != strconv.FormatInt(g.Token, 10) {
		t.Fatalf("stored token %q, want %d", got, g.Token)
	}
	tmp := configMap(ns, "tmp", "go-a")
	if err := c.Create(ctx, tmp); err != nil {
		t.Fatalf("create tmp: %v", err)
	}
	// A delete waits until the mark covers the stored token (unavailable meanwhile): retry.
	deadline := time.Now().Add(20 * time.Second)
	for {
		err = c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "tmp", Namespace: ns}})
		if !fenced.IsUnavailable(err) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("delete: %v", err)
	}
}

// TestSuperseded: after another holder wrote "cfg" with a newer token, every write of this
// holder (whose grant files still say held) is refused with a typed stale_fence, through the
// controller-runtime client and the client-go round-tripper, and the gate stops its runnable.
func TestSuperseded(t *testing.T) {
	ctx, cfg, ns, src := setup(t, "superseded")
	base, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var denied []string
	c := fenced.Wrap(base, src, fenced.WithDenialHandler(func(d *fenced.Denial) { denied = append(denied, d.Code) }))
	var current corev1.ConfigMap
	if err := base.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cfg"}, &current); err != nil {
		t.Fatal(err)
	}
	stale := current.DeepCopy()
	stale.Data["owner"] = "go-stale"
	expectStale(t, "update", c.Update(ctx, stale.DeepCopy()))
	expectStale(t, "merge patch", c.Patch(ctx, stale.DeepCopy(), client.MergeFrom(&current)))
	expectStale(t, "delete", c.Delete(ctx, current.DeepCopy()))
	expectStale(t, "create", c.Create(ctx, configMap(ns, "cfg-new", "go-stale")))
	if err := c.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(ns)); !fenced.IsUnfencedRequest(err) {
		t.Errorf("DeleteAllOf: %v", err)
	}
	if len(denied) != 4 {
		t.Errorf("the denial handler saw %v", denied)
	}

	cs, err := kubernetes.NewForConfig(fenced.WrapConfig(cfg, src))
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().ConfigMaps(ns).Update(ctx, stale.DeepCopy(), metav1.UpdateOptions{})
	expectStale(t, "round-tripper update", err)
	expectStale(t, "round-tripper delete", cs.CoreV1().ConfigMaps(ns).Delete(ctx, "cfg", metav1.DeleteOptions{}))

	gate := leadership.NewGate(src, leadership.WithName("integration"))
	gated := fenced.Wrap(base, src, fenced.WithDenialHandler(gate.Deny))
	gate.Add(manager.RunnableFunc(func(ctx context.Context) error {
		_ = gated.Update(ctx, stale.DeepCopy()) // a queued write of a thawed ex-leader
		<-ctx.Done()
		return nil
	}))
	err = gate.Start(ctx)
	var lost *leadership.LostError
	if !errors.As(err, &lost) || lost.Denial == nil || lost.Denial.Code != fenced.CodeStaleFence {
		t.Fatalf("the gate: %v, want a LostError with stale_fence", err)
	}

	var after corev1.ConfigMap
	if err := base.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cfg"}, &after); err != nil {
		t.Fatal(err)
	}
	if after.Data["owner"] != current.Data["owner"] || after.ResourceVersion != current.ResourceVersion {
		t.Fatalf("the object changed: %v (was %v)", after.Data, current.Data)
	}
}

func expectStale(t *testing.T, what string, err error) {
	t.Helper()
	d, ok := fenced.AsDenial(err)
	if !ok || d.Code != fenced.CodeStaleFence || !fenced.IsStaleFence(err) || fenced.IsHolderMismatch(err) {
		t.Errorf("%s: %v, want a typed stale_fence", what, err)
		return
	}
	t.Logf("%s: refused %s by %s (HTTP %d)", what, d.Code, d.Webhook, d.HTTPStatus)
}
