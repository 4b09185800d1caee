package fenced

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/fencedlease/fencedlease/go/grant"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// The rule of docs/client.md ("Fenced clients"), followed by the controller-runtime wrapper
// and the round-tripper: a subresource write (status, scale) unchanged and only while the
// grant is held; a collection delete refused before anything is sent.

// subCall is one subresource write the recording client saw.
type subCall struct {
	verb, sub, name string
	annotations     map[string]string
	patch           string
}

// subRecorder records every subresource write and DeleteAllOf and answers answer (nil:
// success) without a store: what was sent is the whole point.
type subRecorder struct {
	calls  []subCall
	answer error
}

func (r *subRecorder) client() client.WithWatch {
	base := fake.NewClientBuilder().Build()
	return interceptor.NewClient(base, interceptor.Funcs{
		SubResourceCreate: func(_ context.Context, _ client.Client, sub string, obj, _ client.Object, _ ...client.SubResourceCreateOption) error {
			r.calls = append(r.calls, subCall{verb: "create", sub: sub, name: obj.GetName(), annotations: obj.GetAnnotations()})
			return r.answer
		},
		SubResourceUpdate: func(_ context.Context, _ client.Client, sub string, obj client.Object, _ ...client.SubResourceUpdateOption) error {
			r.calls = append(r.calls, subCall{verb: "update", sub: sub, name: obj.GetName(), annotations: obj.GetAnnotations()})
			return r.answer
		},
		SubResourcePatch: func(_ context.Context, _ client.Client, sub string, obj client.Object, patch client.Patch, _ ...client.SubResourcePatchOption) error {
			data, err := patch.Data(obj)
			if err != nil {
				return err
			}
			r.calls = append(r.calls, subCall{verb: "patch", sub: sub, name: obj.GetName(), annotations: obj.GetAnnotations(), patch: string(data)})
			return r.answer
		},
		SubResourceApply: func(_ context.Context, _ client.Client, sub string, _ runtime.ApplyConfiguration, _ ...client.SubResourceApplyOption) error {
			r.calls = append(r.calls, subCall{verb: "apply", sub: sub})
			return r.answer
		},
		DeleteAllOf: func(context.Context, client.WithWatch, client.Object, ...client.DeleteAllOfOption) error {
			r.calls = append(r.calls, subCall{verb: "deleteallof"})
			return r.answer
		},
	})
}

func fencedDeployment() *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns", ResourceVersion: "4",
		Labels: map[string]string{LeaseLabel: "ctl"}, Annotations: map[string]string{TokenAnnotation: "5"}}}
}

// subresourceWrites are every status and scale write a controller makes of d, each with the
// patch body it must send unchanged ("" for a non-patch).
func subresourceWrites(ctx context.Context, c client.Client, d *appsv1.Deployment) map[string]struct {
	write func() error
	patch string
} {
	old := d.DeepCopy()
	changed := d.DeepCopy()
	changed.Status.ObservedGeneration = 3
	scale := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns"}, Spec: autoscalingv1.ScaleSpec{Replicas: 2}}
	apply := corev1ac.ConfigMap("d", "ns") // a status apply names the object only
	return map[string]struct {
		write func() error
		patch string
	}{
		"status update":      {func() error { return c.Status().Update(ctx, d.DeepCopy()) }, ""},
		"status merge patch": {func() error { return c.Status().Patch(ctx, changed.DeepCopy(), client.MergeFrom(old)) }, `{"status":{"observedGeneration":3}}`},
		"status JSON patch": {func() error {
			return c.Status().Patch(ctx, d.DeepCopy(), client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/status/replicas","value":2}]`)))
		}, `[{"op":"replace","path":"/status/replicas","value":2}]`},
		"status apply": {func() error { return c.Status().Apply(ctx, apply) }, ""},
		"scale update": {func() error {
			return c.SubResource("scale").Update(ctx, d.DeepCopy(), client.WithSubResourceBody(scale.DeepCopy()))
		}, ""},
		"scale merge patch": {func() error {
			return c.SubResource("scale").Patch(ctx, d.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":2}}`)))
		}, `{"spec":{"replicas":2}}`},
		"scale JSON patch": {func() error {
			return c.SubResource("scale").Patch(ctx, d.DeepCopy(), client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec/replicas","value":2}]`)))
		}, `[{"op":"replace","path":"/spec/replicas","value":2}]`},
	}
}

func TestSubresourceWritesAreSentUnchangedWhileHeld(t *testing.T) {
	ctx := context.Background()
	for name := range subresourceWrites(ctx, nil, fencedDeployment()) {
		rec := &subRecorder{}
		w := subresourceWrites(ctx, Wrap(rec.client(), &held{token: 99}), fencedDeployment())[name]
		if err := w.write(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(rec.calls) != 1 {
			t.Fatalf("%s: sent %+v", name, rec.calls)
		}
		got := rec.calls[0]
		if got.verb != "apply" && got.annotations[TokenAnnotation] != "5" {
			t.Errorf("%s: the object's token changed: %v", name, got.annotations)
		}
		if got.patch != w.patch {
			t.Errorf("%s: patch %s, want it unchanged: %s", name, got.patch, w.patch)
		}
	}
}

func TestSubresourceWritesNeedAHeldGrant(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []grant.Kind{grant.KindAbsent, grant.KindLost, grant.KindExpired} {
		rec := &subRecorder{}
		c := Wrap(rec.client(), &held{err: &grant.Error{Kind: kind, Msg: kind.String()}})
		for name, w := range subresourceWrites(ctx, c, fencedDeployment()) {
			if err := w.write(); !errors.Is(err, sentinel(kind)) {
				t.Errorf("%s with %s grant: %v", name, kind, err)
			}
		}
		// A name-only object may be a fenced one: it needs the grant too.
		bare := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns"}}
		if err := c.Status().Update(ctx, bare); !errors.Is(err, sentinel(kind)) {
			t.Errorf("name-only status update with %s grant: %v", kind, err)
		}
		if len(rec.calls) != 0 {
			t.Fatalf("%s grant: sent %+v", kind, rec.calls)
		}
	}
	// An object that shows it is not fenced needs no grant (WithAllObjects: it does).
	plain := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"app": "p"}}}
	rec := &subRecorder{}
	lost := &held{err: &grant.Error{Kind: grant.KindLost, Msg: "lost"}}
	if err := Wrap(rec.client(), lost).Status().Update(ctx, plain); err != nil || len(rec.calls) != 1 {
		t.Fatalf("unfenced status update: %v, sent %+v", err, rec.calls)
	}
	if err := Wrap(rec.client(), lost, WithAllObjects()).Status().Update(ctx, plain); !grant.IsLost(err) || len(rec.calls) != 1 {
		t.Fatalf("WithAllObjects: %v, sent %+v", err, rec.calls)
	}
}

// A superseded ex-holder's status and scale writes are sent (its grant files still say
// held) and the fence's refusal comes back typed, to the denial handler too.
func TestSupersededSubresourceWritesComeBackTyped(t *testing.T) {
	ctx := context.Background()
	rec := &subRecorder{answer: denial(403, "stale_fence: token 5 < mark 9")}
	var denied []string
	c := Wrap(rec.client(), &held{token: 5}, WithDenialHandler(func(d *Denial) { denied = append(denied, d.Code) }))
	writes := subresourceWrites(ctx, c, fencedDeployment())
	for name, w := range writes {
		if err := w.write(); !IsStaleFence(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if len(denied) != len(writes) || len(rec.calls) != len(writes) {
		t.Fatalf("denials %v, sent %d of %d", denied, len(rec.calls), len(writes))
	}
}

func TestDeleteAllOfIsRefusedBeforeSending(t *testing.T) {
	rec := &subRecorder{}
	for _, src := range []grant.Source{&held{token: 1}, &held{err: &grant.Error{Kind: grant.KindLost, Msg: "lost"}}} {
		err := Wrap(rec.client(), src).DeleteAllOf(context.Background(), &corev1.ConfigMap{},
			client.InNamespace("ns"), client.MatchingLabels{LeaseLabel: "ctl"})
		var refused *UnfencedRequest
		if !IsUnfencedRequest(err) || !errors.Is(err, ErrCollectionDelete) || !errors.As(err, &refused) || refused.Method != "DELETE" {
			t.Fatalf("%v", err)
		}
	}
	if len(rec.calls) != 0 {
		t.Fatalf("sent %+v", rec.calls)
	}
}

// TestRouteIsThePythonClients: routeOf gives, path by path, what fencedlease.client.fenced's
// _route gives (read, stamp, delete, as-is, refused).
func TestRouteIsThePythonClients(t *testing.T) {
	const refused = route(-1)
	for _, c := range []struct {
		method, path string
		want         route
	}{
		{"GET", "/api/v1/namespaces/ns/configmaps/x", routeRead},
		{"GET", "/api/v1/namespaces/ns/configmaps", routeRead},
		{"POST", "/api/v1/namespaces/ns/configmaps", routeStamp},
		{"PUT", "/api/v1/namespaces/ns/configmaps/x", routeStamp},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d", routeStamp},
		{"PATCH", "/apis/fencedlease.io/v1alpha1/fencepolicies/p", routeStamp},
		{"PUT", "/apis/apps/v1/namespaces/ns/deployments/d/status", routeAsIs},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", routeAsIs},
		{"PUT", "/apis/apps/v1/namespaces/ns/deployments/d/scale", routeAsIs},
		{"POST", "/api/v1/namespaces/ns/pods/p/eviction", routeAsIs},
		{"PUT", "/api/v1/namespaces/ns/status", routeAsIs},
		{"PUT", "/api/v1/namespaces/ns/finalize", routeAsIs},
		{"PUT", "/api/v1/namespaces/ns", routeStamp},
		{"DELETE", "/api/v1/namespaces/ns/configmaps/x", routeDelete},
		{"DELETE", "/api/v1/namespaces/ns", routeDelete},
		{"DELETE", "/apis/apps/v1/namespaces/ns/deployments/d/status", routeAsIs},
		{"DELETE", "/api/v1/namespaces/ns/configmaps", refused},
		{"DELETE", "/apis/fencedlease.io/v1alpha1/fencepolicies", refused},
		{"DELETE", "/api/v1/namespaces", refused},
		{"DELETE", "/api/v1/nodes", refused},
		{"DELETE", "/api", routeAsIs}, // no resource path: Python's target is None
		{"POST", "/api/v1/namespaces/ns/pods/p/proxy/a/b", routeStamp},
	} {
		got, err := routeOf(c.method, c.path)
		if err != nil {
			if !IsUnfencedRequest(err) {
				t.Errorf("%s %s: %v", c.method, c.path, err)
			}
			got = refused
		}
		if got != c.want {
			t.Errorf("%s %s: route %d, want %d", c.method, c.path, got, c.want)
		}
	}
}

func TestRoundTripperSubresourceWritesUnchangedWhileHeld(t *testing.T) {
	ctx := context.Background()
	cfg, got := apiServer(t, nil)
	src := &held{err: &grant.Error{Kind: grant.KindLost, Msg: "lost"}}
	rest := kubernetes.NewForConfigOrDie(WrapConfig(cfg, src)).AppsV1().RESTClient()
	writes := []struct{ method, path, contentType, body string }{
		{"PUT", "/apis/apps/v1/namespaces/ns/deployments/d/status", "application/json", `{"metadata":{"name":"d","labels":{"fencedlease.io/lease":"l"}},"status":{"replicas":1}}`},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/status", string(types.MergePatchType), `{"status":{"replicas":1}}`},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/status", string(types.JSONPatchType), `[{"op":"replace","path":"/status/replicas","value":1}]`},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/status", string(types.ApplyYAMLPatchType), `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"status":{"replicas":1}}`},
		{"PUT", "/apis/apps/v1/namespaces/ns/deployments/d/scale", "application/json", `{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{"name":"d"},"spec":{"replicas":2}}`},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", string(types.MergePatchType), `{"spec":{"replicas":2}}`},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", string(types.JSONPatchType), `[{"op":"replace","path":"/spec/replicas","value":2}]`},
	}
	send := func(w struct{ method, path, contentType, body string }) error {
		return rest.Verb(w.method).AbsPath(w.path).SetHeader("Content-Type", w.contentType).Body([]byte(w.body)).Do(ctx).Error()
	}
	for _, w := range writes {
		if err := send(w); !grant.IsLost(err) {
			t.Errorf("%s %s with a lost grant: %v", w.method, w.path, err)
		}
	}
	if len(*got) != 0 {
		t.Fatalf("sent without a grant: %+v", *got)
	}
	// A status body that shows an unfenced object needs no grant.
	plain := struct{ method, path, contentType, body string }{"PUT", "/apis/apps/v1/namespaces/ns/deployments/p/status", "application/json", `{"metadata":{"name":"p","labels":{"app":"p"}}}`}
	if err := send(plain); err != nil || len(*got) != 1 || (*got)[0].body != plain.body {
		t.Fatalf("unfenced status write: %v %+v", err, *got)
	}
	src.set(70, nil)
	for _, w := range writes {
		if err := send(w); err != nil {
			t.Fatalf("%s %s: %v", w.method, w.path, err)
		}
	}
	r := (*got)[1:]
	if len(r) != len(writes) {
		t.Fatalf("requests %+v", r)
	}
	for i, w := range writes {
		if r[i].method != w.method || r[i].path != w.path || r[i].body != w.body || r[i].contentType != w.contentType {
			t.Errorf("sent %+v, want unchanged %+v", r[i], w)
		}
	}
}

func TestRoundTripperRefusesACollectionDeleteBeforeSending(t *testing.T) {
	ctx := context.Background()
	cfg, got := apiServer(t, nil)
	for _, src := range []grant.Source{&held{token: 70}, &held{err: &grant.Error{Kind: grant.KindLost, Msg: "lost"}}} {
		cs := kubernetes.NewForConfigOrDie(WrapConfig(cfg, src))
		err := cs.CoreV1().ConfigMaps("ns").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: LeaseLabel + "=ctl"})
		var refused *UnfencedRequest
		if !IsUnfencedRequest(err) || !errors.As(err, &refused) || refused.Method != http.MethodDelete || refused.Path != "/api/v1/namespaces/ns/configmaps" {
			t.Fatalf("collection delete: %v", err)
		}
		err = cs.AppsV1().RESTClient().Delete().AbsPath("/apis/apps/v1/deployments").Do(ctx).Error()
		if !IsUnfencedRequest(err) {
			t.Fatalf("all namespaces' collection delete: %v", err)
		}
	}
	if len(*got) != 0 {
		t.Fatalf("sent %+v", *got)
	}
}

// A superseded ex-holder's scale write through the round-tripper is sent and its refusal
// reaches the denial handler.
func TestRoundTripperReportsASubresourceDenial(t *testing.T) {
	ctx := context.Background()
	cfg, got := apiServer(t, func(*http.Request) (int, any) {
		return 403, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Code: 403, Reason: "Forbidden",
			Message: `admission webhook "fence.fencedlease.io" denied the request: stale_fence: a newer grant committed`}
	})
	var denied []string
	cs := kubernetes.NewForConfigOrDie(WrapConfig(cfg, &held{token: 5}, WithDenialHandler(func(d *Denial) { denied = append(denied, d.Code) })))
	_, err := cs.AppsV1().Deployments("ns").UpdateScale(ctx, "d", &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: autoscalingv1.ScaleSpec{Replicas: 2}}, metav1.UpdateOptions{})
	if !IsStaleFence(err) || len(denied) != 1 || len(*got) != 1 {
		t.Fatalf("%v %v %d", err, denied, len(*got))
	}
}
