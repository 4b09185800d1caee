package fenced

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencedlease/fencedlease/go/grant"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// held is a grant source that holds token t (or fails with err).
type held struct {
	mu    sync.Mutex
	token int64
	err   error
}

func (h *held) set(token int64, err error) { h.mu.Lock(); h.token, h.err = token, err; h.mu.Unlock() }
func (h *held) Describe() string           { return "test" }
func (h *held) Current() (grant.Grant, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return grant.Grant{}, h.err
	}
	return grant.Grant{Token: h.token, LeaseID: "g", State: "held", ValidUntil: time.Now().Add(time.Hour)}, nil
}

// call is one request the fake API server saw.
type call struct {
	verb, sub, name, token string
	patchType              types.PatchType
	patch                  string
	preRV                  string
}

// server is a fake API server with a fence: a write of a labelled object is refused
// stale_fence when its token is below the mark, holder_mismatch when it carries none.
type server struct {
	client.WithWatch
	mu    sync.Mutex
	calls []call
	mark  int64
}

func (s *server) record(c call) { s.mu.Lock(); s.calls = append(s.calls, c); s.mu.Unlock() }

func (s *server) fence(obj client.Object) error {
	if _, ok := obj.GetLabels()[LeaseLabel]; !ok {
		return nil
	}
	t, err := strconv.ParseInt(obj.GetAnnotations()[TokenAnnotation], 10, 64)
	if err != nil {
		return denial(403, "holder_mismatch: no token")
	}
	if t < s.mark {
		return denial(403, fmt.Sprintf("stale_fence: token %d < mark %d", t, s.mark))
	}
	return nil
}

func denial(code int32, msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: metav1.StatusReasonForbidden,
		Message: `admission webhook "cm.objects.fencedlease.io" denied the request: ` + msg}}
}

func newServer(t *testing.T, objs ...client.Object) *server {
	t.Helper()
	s := &server{}
	base := fake.NewClientBuilder().WithObjects(objs...).Build()
	s.WithWatch = interceptor.NewClient(base, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			s.record(call{verb: "create", name: obj.GetName(), token: obj.GetAnnotations()[TokenAnnotation]})
			if err := s.fence(obj); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			s.record(call{verb: "update", name: obj.GetName(), token: obj.GetAnnotations()[TokenAnnotation]})
			if err := s.fence(obj); err != nil {
				return err
			}
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			data, err := patch.Data(obj)
			if err != nil {
				return err
			}
			s.record(call{verb: "patch", name: obj.GetName(), patchType: patch.Type(), patch: string(data)})
			return c.Patch(ctx, obj, client.RawPatch(patch.Type(), data), opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			do := (&client.DeleteOptions{}).ApplyOptions(opts)
			rv := ""
			if do.Preconditions != nil && do.Preconditions.ResourceVersion != nil {
				rv = *do.Preconditions.ResourceVersion
			}
			s.record(call{verb: "delete", name: obj.GetName(), preRV: rv})
			return c.Delete(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			s.record(call{verb: "update", sub: sub, name: obj.GetName(), token: obj.GetAnnotations()[TokenAnnotation]})
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	return s
}

func cm(name string, labelled bool) *corev1.ConfigMap {
	obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Data: map[string]string{"k": "v"}}
	if labelled {
		obj.Labels = map[string]string{LeaseLabel: "ctl"}
	}
	return obj
}

func stored(t *testing.T, s *server, name string) *corev1.ConfigMap {
	t.Helper()
	var out corev1.ConfigMap
	if err := s.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

func TestCreateAndUpdateStampLabelledObjectsOnly(t *testing.T) {
	ctx := context.Background()
	s := newServer(t)
	c := Wrap(s, &held{token: 42})
	if err := c.Create(ctx, cm("fenced", true)); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, cm("plain", false)); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, "fenced").Annotations[TokenAnnotation]; got != "42" {
		t.Errorf("fenced create token %q", got)
	}
	if got, ok := stored(t, s, "plain").Annotations[TokenAnnotation]; ok {
		t.Errorf("plain create stamped %q", got)
	}
	obj := stored(t, s, "fenced")
	obj.Data["k"] = "w"
	c = Wrap(s, &held{token: 43})
	if err := c.Update(ctx, obj); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, "fenced").Annotations[TokenAnnotation]; got != "43" {
		t.Errorf("update token %q", got)
	}
	all := Wrap(s, &held{token: 44}, WithAllObjects())
	if err := all.Create(ctx, cm("plain2", false)); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, "plain2").Annotations[TokenAnnotation]; got != "44" {
		t.Errorf("WithAllObjects: %q", got)
	}
}

func TestPatchesOfEveryTypeCarryTheToken(t *testing.T) {
	ctx := context.Background()
	obj := cm("x", true)
	obj.Annotations = map[string]string{TokenAnnotation: "1"}
	s := newServer(t, obj)
	c := Wrap(s, &held{token: 50})

	read := stored(t, s, "x")
	changed := read.DeepCopy()
	changed.Data["k"] = "merge"
	if err := c.Patch(ctx, changed, client.MergeFrom(read)); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, "x"); got.Annotations[TokenAnnotation] != "50" || got.Data["k"] != "merge" {
		t.Errorf("merge patch: %v %v", got.Annotations, got.Data)
	}

	c = Wrap(s, &held{token: 51})
	skeleton := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns"}}
	if err := c.Patch(ctx, skeleton, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/data/k","value":"json"}]`))); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, "x"); got.Annotations[TokenAnnotation] != "51" || got.Data["k"] != "json" {
		t.Errorf("JSON patch on a name-only object: %v %v", got.Annotations, got.Data)
	}

	c = Wrap(s, &held{token: 52})
	if err := c.Patch(ctx, skeleton.DeepCopy(), client.RawPatch(types.StrategicMergePatchType, []byte(`{"data":{"k":"smp"}}`))); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, "x"); got.Annotations[TokenAnnotation] != "52" || got.Data["k"] != "smp" {
		t.Errorf("strategic merge patch: %v %v", got.Annotations, got.Data)
	}

	// An object read with labels and no lease label is not fenced: its patch is not stamped.
	plain := cm("p", false)
	plain.Labels = map[string]string{"app": "x"}
	s2 := newServer(t, plain)
	read2 := stored(t, s2, "p")
	ch := read2.DeepCopy()
	ch.Data["k"] = "z"
	if err := Wrap(s2, &held{token: 9}).Patch(ctx, ch, client.MergeFrom(read2)); err != nil {
		t.Fatal(err)
	}
	if got, ok := stored(t, s2, "p").Annotations[TokenAnnotation]; ok {
		t.Errorf("unfenced patch stamped %q", got)
	}
}

func TestApplyConfigurationIsStampedInPlace(t *testing.T) {
	ac := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "a", "labels": map[string]any{LeaseLabel: "ctl"}}}
	var sent []byte
	f := &fence{src: &held{token: 77}, o: build(nil)}
	u := &applyDoc{doc: ac}
	err := f.apply(context.Background(), u, func() error {
		var e error
		sent, e = json.Marshal(u)
		return e
	})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(sent, &doc); err != nil || doc.Metadata.Annotations[TokenAnnotation] != "77" || doc.Metadata.Labels[LeaseLabel] != "ctl" {
		t.Fatalf("applied %s (%v)", sent, err)
	}
	plain := &applyDoc{doc: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "b"}}}
	if err := f.apply(context.Background(), plain, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, ok := plain.doc["metadata"].(map[string]any)["annotations"]; ok {
		t.Error("an unlabelled apply configuration was stamped")
	}
}

// applyDoc is an apply configuration kept as a JSON document.
type applyDoc struct{ doc map[string]any }

func (a *applyDoc) IsApplyConfiguration()        {}
func (a *applyDoc) MarshalJSON() ([]byte, error) { return json.Marshal(a.doc) }
func (a *applyDoc) UnmarshalJSON(b []byte) error {
	var add map[string]any
	if err := json.Unmarshal(b, &add); err != nil {
		return err
	}
	merge(a.doc, add)
	return nil
}

func merge(dst, src map[string]any) {
	for k, v := range src {
		if sub, ok := v.(map[string]any); ok {
			if d, ok := dst[k].(map[string]any); ok {
				merge(d, sub)
				continue
			}
		}
		dst[k] = v
	}
}

func TestDeleteWritesTheTokenThenDeletesAtThatVersion(t *testing.T) {
	ctx := context.Background()
	obj := cm("d", true)
	obj.Annotations = map[string]string{TokenAnnotation: "3"}
	s := newServer(t, obj)
	c := Wrap(s, &held{token: 60})
	if err := c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns"}}); err != nil {
		t.Fatal(err)
	}
	if len(s.calls) != 2 || s.calls[0].verb != "patch" || s.calls[1].verb != "delete" {
		t.Fatalf("calls %+v", s.calls)
	}
	if s.calls[0].patchType != types.MergePatchType || s.calls[0].patch != `{"metadata":{"annotations":{"fencedlease.io/token":"60"}}}` {
		t.Errorf("token patch %+v", s.calls[0])
	}
	if s.calls[1].preRV == "" {
		t.Error("the delete has no resourceVersion precondition")
	}
	if err := s.Get(ctx, client.ObjectKeyFromObject(obj), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("still there: %v", err)
	}
}

func TestDeleteKeepsTheCallersPreconditionOnThePatch(t *testing.T) {
	ctx := context.Background()
	s := newServer(t, cm("d", true))
	c := Wrap(s, &held{token: 61})
	err := c.Delete(ctx, cm("d", true), client.Preconditions{ResourceVersion: new("12345")})
	if !apierrors.IsConflict(err) {
		t.Fatalf("a stale resourceVersion precondition: %v, want a conflict", err)
	}
	if len(s.calls) != 1 || s.calls[0].verb != "patch" {
		t.Fatalf("calls %+v: the patch must carry the precondition and nothing be deleted", s.calls)
	}
}

func TestDeleteOfAnUnfencedObjectIsOneRequest(t *testing.T) {
	plain := cm("p", false)
	plain.Labels = map[string]string{"app": "x"}
	s := newServer(t, plain)
	if err := Wrap(s, &held{err: &grant.Error{Kind: grant.KindAbsent, Msg: "none"}}).Delete(context.Background(), plain); err != nil {
		t.Fatal(err)
	}
	if len(s.calls) != 1 || s.calls[0].verb != "delete" || s.calls[0].preRV != "" {
		t.Fatalf("calls %+v", s.calls)
	}
}

func TestDeleteAllOfIsRefused(t *testing.T) {
	s := newServer(t)
	err := Wrap(s, &held{token: 1}).DeleteAllOf(context.Background(), &corev1.ConfigMap{}, client.InNamespace("ns"))
	if !IsUnfencedRequest(err) {
		t.Fatalf("%v", err)
	}
}

func TestNoHeldGrantSendsNothing(t *testing.T) {
	ctx := context.Background()
	obj := cm("x", true)
	s := newServer(t, obj)
	for _, kind := range []grant.Kind{grant.KindAbsent, grant.KindLost, grant.KindExpired, grant.KindMalformed} {
		c := Wrap(s, &held{err: &grant.Error{Kind: kind, Msg: kind.String()}})
		read := stored(t, s, "x")
		writes := map[string]func() error{
			"create": func() error { return c.Create(ctx, cm("y", true)) },
			"update": func() error { return c.Update(ctx, read.DeepCopy()) },
			"patch":  func() error { return c.Patch(ctx, read.DeepCopy(), client.MergeFrom(read)) },
			"delete": func() error { return c.Delete(ctx, read.DeepCopy()) },
			"status": func() error { return c.Status().Update(ctx, read.DeepCopy()) },
		}
		for name, write := range writes {
			if err := write(); !grant.IsGrantError(err) || !errors.Is(err, sentinel(kind)) {
				t.Errorf("%s with %s grant: %v", name, kind, err)
			}
		}
	}
	if len(s.calls) != 0 {
		t.Fatalf("sent %+v", s.calls)
	}
}

func sentinel(k grant.Kind) error {
	return map[grant.Kind]error{grant.KindAbsent: grant.ErrAbsent, grant.KindLost: grant.ErrLost,
		grant.KindExpired: grant.ErrExpired, grant.KindMalformed: grant.ErrMalformed}[k]
}

func TestStatusWritesPassAsTheyAre(t *testing.T) {
	ctx := context.Background()
	obj := cm("x", true)
	obj.Annotations = map[string]string{TokenAnnotation: "5"}
	s := newServer(t, obj)
	read := stored(t, s, "x")
	if err := Wrap(s, &held{token: 99}).Status().Update(ctx, read); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if len(s.calls) != 1 || s.calls[0].sub != "status" || s.calls[0].token != "5" {
		t.Fatalf("status write changed: %+v", s.calls)
	}
}

func TestTheFencesDenialComesBackTyped(t *testing.T) {
	ctx := context.Background()
	s := newServer(t)
	s.mark = 10
	var seen []*Denial
	c := Wrap(s, &held{token: 9}, WithDenialHandler(func(d *Denial) { seen = append(seen, d) }))
	err := c.Create(ctx, cm("late", true))
	if !IsStaleFence(err) || IsHolderMismatch(err) || !apierrors.IsForbidden(err) {
		t.Fatalf("%v", err)
	}
	var d *Denial
	if !errors.As(err, &d) || d.Code != CodeStaleFence || d.Webhook != "cm.objects.fencedlease.io" || !d.Definitive() {
		t.Fatalf("%#v", d)
	}
	if len(seen) != 1 || seen[0].Code != CodeStaleFence {
		t.Fatalf("handler saw %v", seen)
	}
}

func TestDenialCodesAreReadFromTheStatusNotTheProse(t *testing.T) {
	checks := map[string]func(error) bool{
		CodeStaleFence: IsStaleFence, CodeHolderMismatch: IsHolderMismatch, CodeUnknownToken: IsUnknownToken,
		CodeLeaseMismatch: IsLeaseMismatch, CodeDuplicate: IsDuplicate, CodeInvalid: IsInvalid, CodeUnavailable: IsUnavailable,
	}
	for code := range checks {
		err := denial(denialHTTP[code], code+": whatever the prose says (stale_fence, holder_mismatch)")
		for other, otherIs := range checks {
			if otherIs(err) != (other == code) {
				t.Errorf("%s read as %s: %v", code, other, otherIs(err))
			}
		}
		if Code(fmt.Errorf("wrapped: %w", err)) != code {
			t.Errorf("%s wrapped", code)
		}
		if IsFenceDenial(denial(418, code+": x")) {
			t.Errorf("%s with another HTTP status", code)
		}
	}
	notOurs := []error{
		&apierrors.StatusError{ErrStatus: metav1.Status{Code: 403, Message: `admission webhook "policy.example.com" denied the request: stale_fence: x`}},
		&apierrors.StatusError{ErrStatus: metav1.Status{Code: 403, Message: `admission webhook "evilfencedlease.io" denied the request: stale_fence: x`}},
		&apierrors.StatusError{ErrStatus: metav1.Status{Code: 403, Message: `configmaps "x" is forbidden: stale_fence: User cannot update`}},
		&apierrors.StatusError{ErrStatus: metav1.Status{Code: 403, Message: `admission webhook "fence.fencedlease.io" denied the request: stale_fencex: y`}},
		apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "x", errors.New("stale_fence")),
		errors.New(`admission webhook "fence.fencedlease.io" denied the request: stale_fence: not an API status`),
		nil,
	}
	for _, err := range notOurs {
		if IsFenceDenial(err) {
			t.Errorf("read as a fence denial: %v", err)
		}
	}
	if !IsHolderMismatch(&apierrors.StatusError{ErrStatus: metav1.Status{Code: 403, Message: `admission webhook "fence.fencedlease.io" denied the request: holder_mismatch`}}) {
		t.Error("a code with nothing after it")
	}
}

func TestStampBody(t *testing.T) {
	for _, tc := range []struct{ ct, in, want string }{
		{"application/json", `{"kind":"ConfigMap"}`, `{"kind":"ConfigMap","metadata":{"annotations":{"fencedlease.io/token":"7"}}}`},
		{"application/merge-patch+json", `{"metadata":{"annotations":null},"data":{"a":"b"}}`, `{"data":{"a":"b"},"metadata":{"annotations":{"fencedlease.io/token":"7"}}}`},
		{"application/strategic-merge-patch+json; charset=utf-8", `{}`, `{"metadata":{"annotations":{"fencedlease.io/token":"7"}}}`},
		{"application/json-patch+json", `[{"op":"remove","path":"/data/a"}]`, `[{"op":"remove","path":"/data/a"},{"op":"add","path":"/metadata/annotations/fencedlease.io~1token","value":"7"}]`},
		{"application/apply-patch+yaml", "kind: ConfigMap\nmetadata:\n  name: x\n", `{"kind":"ConfigMap","metadata":{"annotations":{"fencedlease.io/token":"7"},"name":"x"}}`},
	} {
		got, err := stampBody([]byte(tc.in), tc.ct, "7")
		if err != nil || string(got) != tc.want {
			t.Errorf("%s %s: %s %v; want %s", tc.ct, tc.in, got, err, tc.want)
		}
	}
	for _, ct := range []string{"application/vnd.kubernetes.protobuf", "application/cbor", "application/apply-patch+cbor"} {
		if _, err := stampBody([]byte("x"), ct, "7"); !errors.Is(err, ErrCannotStamp) {
			t.Errorf("%s: %v", ct, err)
		}
	}
	if _, err := stampBody([]byte("[1]"), "application/json", "7"); !errors.Is(err, ErrCannotStamp) {
		t.Errorf("a JSON array body: %v", err)
	}
}
