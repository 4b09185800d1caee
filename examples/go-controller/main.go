// Command go-controller is the Go example of fencedlease (docs/go.md,
// examples/go-controller/README.md): a controller-runtime controller, run as two replicas that
// are the candidate Pods of the FencedLease "go-controller", with the three lines docs/go.md
// adds to a kubebuilder main.go. Only the replica holding the grant runs the controller, and
// every write it makes goes through the fenced client.
//
// It reconciles Beacons (example.com/v1, a custom resource with a status subresource). Each
// round, the leader decides four writes of a Beacon and sends them together:
//
//   - spec: a merge patch of spec.leader and spec.round (the fenced client stamps the token);
//   - status: a merge patch of status.leader, status.round and status.token (the fence decides
//     a status write from the writing Pod: only the grant's holder is admitted);
//   - create: this round's child ConfigMap <beacon>-<pod>-<boot>-<round>;
//   - delete: this replica's children of earlier rounds (the fenced delete plan).
//
// The controller fences what it writes: its spec patch labels the Beacon
// fencedlease.io/lease: <FENCEDLEASE_LEASE> (a fenced write, stamped like any other) and the
// children carry the label too. A Beacon labelled example.com/fenced: "false" is the control:
// the same writes, nothing labelled, nothing fenced.
//
// WRITE_HOLD (a duration, default 0) holds every request of the manager's client that long
// after the fenced client stamped it, then sends it even if the controller has stopped
// meanwhile: the demo's stand-in for a request stuck in a slow network, or a process paused
// between stamping and sending. The e2e freezes the leader during the hold (ctr tasks pause)
// so that, on thaw, writes decided under the old grant reach the API server, whose fence
// refuses them (IsStaleFence, IsHolderMismatch). Leave it 0 in a real deployment.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencedlease/fencedlease/go/fenced"
	"github.com/fencedlease/fencedlease/go/grant"
	"github.com/fencedlease/fencedlease/go/leadership"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// BeaconGVK is the example's custom resource (manifests.yaml defines it).
var BeaconGVK = schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Beacon"}

// The labels of a Beacon's children: which Beacon, which replica wrote them.
const (
	BeaconLabel = "example.com/beacon"
	WriterLabel = "example.com/writer"
	// FencedLabel "false" on a Beacon: the control, nothing fenced.
	FencedLabel = "example.com/fenced"
)

// ExitNotLeading is the exit code when leadership ended (the Pod restarts as a candidate).
const ExitNotLeading = 3

var log = ctrl.Log.WithName("go-controller")

func main() {
	ctrl.SetLogger(zap.New())
	hold, err := envDuration("WRITE_HOLD", 0)
	if err != nil {
		fail(err)
	}
	every, err := envDuration("ROUND_INTERVAL", 2*time.Second)
	if err != nil {
		fail(err)
	}
	namespace := os.Getenv("POD_NAMESPACE")
	pod := os.Getenv("POD_NAME")
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fail(err)
	}
	options := ctrl.Options{
		Scheme:                 scheme,
		LeaderElection:         false, // fencedlease elects (docs/go.md)
		HealthProbeBindAddress: ":8081",
		Metrics:                metricsserver.Options{BindAddress: ":8080"},
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}},
	}
	if hold > 0 {
		options.NewClient = heldClient(hold)
	}

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), options)
	if err != nil {
		fail(err)
	}
	// The change docs/go.md describes: the manager wrapped, everything below uses the wrapper.
	mgr, err = leadership.Wrap(mgr, grant.NewDir(grant.DefaultDir), leadership.Options{})
	if err != nil {
		fail(err)
	}

	// Readiness answers whether the process runs, not whether it leads: the operator grants
	// the lease to a Ready candidate, and a frozen leader turns unready and loses it.
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		fail(err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		fail(err)
	}
	lease := os.Getenv("FENCEDLEASE_LEASE")
	if lease == "" {
		lease = "go-controller"
	}
	r := &Reconciler{Client: mgr.GetClient(), Pod: pod, Lease: lease, Boot: boot(), Every: every}
	beacon := &unstructured.Unstructured{}
	beacon.SetGroupVersionKind(BeaconGVK)
	if err := ctrl.NewControllerManagedBy(mgr).For(beacon).Named("beacon").Complete(r); err != nil {
		fail(err)
	}
	log.Info("starting", "pod", pod, "writeHold", hold.String(), "roundInterval", every.String())
	err = mgr.Start(ctrl.SetupSignalHandler())
	if errors.Is(err, leadership.ErrNotLeading) {
		log.Error(err, "leadership lost: exiting, the Pod restarts as a candidate")
		os.Exit(ExitNotLeading)
	}
	if err != nil {
		fail(err)
	}
}

// Reconciler writes each Beacon's rounds (see the package doc).
type Reconciler struct {
	Client client.Client
	Pod    string
	Lease  string // the FencedLease whose label the written objects carry
	Boot   string
	Every  time.Duration

	mu    sync.Mutex
	round int
	last  map[string]time.Time
}

// write is one of a round's writes: its name, and the call.
type write struct {
	what string
	send func(context.Context) error
}

// Reconcile runs one round for the Beacon, at most one per Every.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	if r.last == nil {
		r.last = map[string]time.Time{}
	}
	if since := time.Since(r.last[req.String()]); since < r.Every {
		r.mu.Unlock()
		return ctrl.Result{RequeueAfter: r.Every - since}, nil
	}
	r.round++
	round := r.round
	r.mu.Unlock()

	b := &unstructured.Unstructured{}
	b.SetGroupVersionKind(BeaconGVK)
	if err := r.Client.Get(ctx, req.NamespacedName, b); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var children corev1.ConfigMapList
	if err := r.Client.List(ctx, &children, client.InNamespace(req.Namespace),
		client.MatchingLabels{BeaconLabel: b.GetName(), WriterLabel: r.Pod}); err != nil {
		return ctrl.Result{}, err
	}
	fencedRound := b.GetLabels()[FencedLabel] != "false"
	writes := []write{
		{"spec", func(ctx context.Context) error {
			// The whole intended state, not a diff from what was read: a diff would leave out
			// a field that already shows this Pod, and a thawed leader's write would not say
			// what it decided.
			meta := map[string]any{}
			changed := b.DeepCopy()
			if fencedRound {
				labels := changed.GetLabels()
				if labels == nil {
					labels = map[string]string{}
				}
				labels[fenced.LeaseLabel] = r.Lease
				changed.SetLabels(labels) // the fenced client stamps what the object shows
				meta["labels"] = map[string]string{fenced.LeaseLabel: r.Lease}
			}
			return r.Client.Patch(ctx, changed, mergePatch(map[string]any{
				"metadata": meta, "spec": map[string]any{"leader": r.Pod, "round": round},
			}))
		}},
		{"status", func(ctx context.Context) error {
			// No resourceVersion (docs/go.md recommends MergeFromWithOptimisticLock): with one,
			// a thawed leader's write would fail with a Conflict before the fence is asked;
			// this example shows the fence's own answer. The fence admits only the holder's
			// status writes.
			return r.Client.Status().Patch(ctx, b.DeepCopy(), mergePatch(map[string]any{
				"status": map[string]any{"leader": r.Pod, "round": round},
			}))
		}},
		{"create", func(ctx context.Context) error {
			return r.Client.Create(ctx, r.child(b, round, fencedRound))
		}},
	}
	for i := range children.Items {
		child := children.Items[i].DeepCopy()
		writes = append(writes, write{"delete " + child.Name, func(ctx context.Context) error {
			return client.IgnoreNotFound(r.Client.Delete(ctx, child))
		}})
	}
	names := make([]string, len(writes))
	for i, w := range writes {
		names[i] = w.what
	}
	log.Info("queued round", "beacon", req.String(), "round", round, "fenced", fencedRound,
		"writes", strings.Join(names, ", "))

	errs := make([]error, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.send(ctx)
		}()
	}
	wg.Wait()
	failed := false
	for i, err := range errs {
		report(req.String(), round, writes[i].what, err)
		failed = failed || err != nil
	}
	r.mu.Lock()
	r.last[req.String()] = time.Now()
	r.mu.Unlock()
	if failed {
		return ctrl.Result{}, fmt.Errorf("round %d of %s: %w", round, req, errors.Join(errs...))
	}
	log.Info("round done", "beacon", req.String(), "round", round)
	return ctrl.Result{RequeueAfter: r.Every}, nil
}

// child is this round's ConfigMap: owned by the Beacon (the garbage collector deletes it
// with the Beacon), fenced unless the Beacon is the control.
func (r *Reconciler) child(b *unstructured.Unstructured, round int, fencedRound bool) *corev1.ConfigMap {
	labels := map[string]string{BeaconLabel: b.GetName(), WriterLabel: r.Pod}
	if fencedRound {
		labels[fenced.LeaseLabel] = r.Lease
	}
	yes := true
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s-%s-%s-%d", b.GetName(), r.Pod, r.Boot, round),
			Namespace: b.GetNamespace(),
			Labels:    labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: BeaconGVK.GroupVersion().String(), Kind: BeaconGVK.Kind,
				Name: b.GetName(), UID: b.GetUID(), BlockOwnerDeletion: &yes,
			}},
		},
		Data: map[string]string{"leader": r.Pod, "round": strconv.Itoa(round)},
	}
}

// mergePatch is a JSON merge patch of body.
func mergePatch(body map[string]any) client.Patch {
	data, err := json.Marshal(body)
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return client.RawPatch(types.MergePatchType, data)
}

// report logs a write's outcome: the typed checks of docs/go.md on a refusal.
func report(beacon string, round int, what string, err error) {
	switch {
	case err == nil:
		log.Info("write sent", "beacon", beacon, "round", round, "write", what)
	case fenced.IsStaleFence(err) || fenced.IsHolderMismatch(err):
		// Another Pod leads: the gate stops the controller; never retry under this grant.
		d, _ := fenced.AsDenial(err)
		log.Info("write refused by the fence", "beacon", beacon, "round", round, "write", what,
			"code", d.Code, "webhook", d.Webhook, "http", d.HTTPStatus,
			"IsStaleFence", fenced.IsStaleFence(err), "IsHolderMismatch", fenced.IsHolderMismatch(err))
	case fenced.IsUnavailable(err):
		log.Info("fence unavailable: retried with backoff", "beacon", beacon, "round", round, "write", what, "error", err.Error())
	case grant.IsAbsent(err) || grant.IsLost(err) || grant.IsExpired(err):
		log.Info("not sent: no held grant", "beacon", beacon, "round", round, "write", what, "error", err.Error())
	case apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err):
		log.Info("write lost a race: retried", "beacon", beacon, "round", round, "write", what, "error", err.Error())
	default:
		log.Error(err, "write failed", "beacon", beacon, "round", round, "write", what)
	}
}

// heldClient is the manager's client with every write held for d after the fenced client
// stamped it, then sent whether or not the caller still waits (see WRITE_HOLD above).
func heldClient(d time.Duration) client.NewClientFunc {
	return func(config *rest.Config, options client.Options) (client.Client, error) {
		c, err := client.NewWithWatch(config, options)
		if err != nil {
			return nil, err
		}
		held := func(ctx context.Context) context.Context {
			time.Sleep(d)
			return context.WithoutCancel(ctx)
		}
		return interceptor.NewClient(c, interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				return c.Create(held(ctx), obj, opts...)
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				return c.Update(held(ctx), obj, opts...)
			},
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				return c.Patch(held(ctx), obj, patch, opts...)
			},
			Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				return c.Delete(held(ctx), obj, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				return c.SubResource(sub).Patch(held(ctx), obj, patch, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				return c.SubResource(sub).Update(held(ctx), obj, opts...)
			},
		}), nil
	}
}

func envDuration(name string, fallback time.Duration) (time.Duration, error) {
	text := os.Getenv(name)
	if text == "" {
		return fallback, nil
	}
	d, err := time.ParseDuration(text)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", name, text, err)
	}
	return d, nil
}

// boot tells this process's children from an earlier container's of the same Pod.
func boot() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func fail(err error) {
	log.Error(err, "go-controller")
	os.Exit(1)
}
