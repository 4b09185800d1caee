// Package fenced makes a controller's writes carry its fencing token (docs/go.md,
// docs/fenced-objects.md): a controller-runtime client.Client wrapper (built on the upstream
// interceptor package) and a client-go rest.Config round-tripper for other clients.
//
// Every Create, Update, Patch and Apply of a fenced object carries the current grant's token
// in the annotation fencedlease.io/token; a Delete is two requests (the token written first,
// then the delete with that write's resourceVersion as precondition), because the webhook
// checks the stored token of a delete. A write of a subresource (Status(), SubResource("scale"),
// any verb and patch type) is sent unchanged, still only while the grant is held: the fence
// decides a status or scale write by who writes (docs/fenced-objects.md, "Status writes",
// "Scale writes"). DeleteAllOf is refused before anything is sent (IsUnfencedRequest). The
// same rule as the Python client's (docs/client.md, "Fenced clients"). A refusal by the
// fence comes back as a *Denial (IsStaleFence, IsHolderMismatch...).
//
// With no held grant (absent, lost, past its deadline) nothing is sent and the grant
// package's error is returned: an efficiency check only. The fence at the API server is the
// safety: a write decided while leading and sent after a pause is refused there.
package fenced

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/fencedlease/fencedlease/go/grant"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// The label that makes an object fenced, and the annotation that carries the token.
const (
	LeaseLabel      = "fencedlease.io/lease"
	TokenAnnotation = "fencedlease.io/token"
)

type options struct {
	all          bool
	minRemaining time.Duration
	onDenial     func(*Denial)
	now          func() time.Time
}

// Option configures the wrapper.
type Option func(*options)

// WithAllObjects stamps every write, not only fenced objects' (as the Python client does).
func WithAllObjects() Option { return func(o *options) { o.all = true } }

// WithMinRemaining refuses to send a write when less than d of the grant remains.
func WithMinRemaining(d time.Duration) Option { return func(o *options) { o.minRemaining = d } }

// WithDenialHandler calls f on every fence denial (package leadership stops leading on one).
func WithDenialHandler(f func(*Denial)) Option { return func(o *options) { o.onDenial = f } }

func build(opts []Option) *options {
	o := &options{now: time.Now}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// Fenced reports whether obj is a fenced object as far as its own metadata shows: labelled
// fencedlease.io/lease, or carrying a token (a write that removes the label still needs one).
func Fenced(obj client.Object) bool {
	if _, ok := obj.GetLabels()[LeaseLabel]; ok {
		return true
	}
	_, ok := obj.GetAnnotations()[TokenAnnotation]
	return ok
}

// unknown: an object passed with no labels and no annotations (a name only, for a Patch or a
// Delete) may be a fenced one: it is treated as fenced.
func unknown(obj client.Object) bool {
	return len(obj.GetLabels()) == 0 && len(obj.GetAnnotations()) == 0
}

type fence struct {
	src grant.Source
	o   *options
}

// token is the current grant's token, or the grant error (nothing is sent then).
func (f *fence) token() (string, error) {
	g, err := f.src.Current()
	if err != nil {
		return "", err
	}
	if err := g.Check(f.o.now(), f.o.minRemaining); err != nil {
		return "", err
	}
	return strconv.FormatInt(g.Token, 10), nil
}

// denied turns a fence denial into a *Denial (and tells the handler); other errors pass.
func (f *fence) denied(err error) error {
	if err == nil {
		return nil
	}
	d, ok := AsDenial(err)
	if !ok {
		return err
	}
	if f.o.onDenial != nil {
		f.o.onDenial(d)
	}
	return d
}

func setToken(obj client.Object, token string) {
	annotations := obj.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[TokenAnnotation] = token
	obj.SetAnnotations(annotations)
}

// Wrap returns c with every write fenced by the grant src gives (see the package doc).
func Wrap(c client.Client, src grant.Source, opts ...Option) client.Client {
	w, ok := c.(client.WithWatch)
	if !ok {
		w = noWatch{c}
	}
	return interceptor.NewClient(w, Funcs(src, opts...))
}

// NewClientFunc wraps a manager's default client (controller-runtime's Options.NewClient).
func NewClientFunc(src grant.Source, opts ...Option) client.NewClientFunc {
	return func(config *restConfig, options client.Options) (client.Client, error) {
		c, err := client.New(config, options)
		if err != nil {
			return nil, err
		}
		return Wrap(c, src, opts...), nil
	}
}

type noWatch struct{ client.Client }

func (noWatch) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errNoWatch
}

// Funcs are the interceptor functions that fence the writes (compose them with other
// interceptors, or use Wrap).
func Funcs(src grant.Source, opts ...Option) interceptor.Funcs {
	f := &fence{src: src, o: build(opts)}
	return interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if !f.o.all && !Fenced(obj) {
				return c.Create(ctx, obj, opts...)
			}
			token, err := f.token()
			if err != nil {
				return err
			}
			setToken(obj, token)
			return f.denied(c.Create(ctx, obj, opts...))
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if !f.o.all && !Fenced(obj) {
				return c.Update(ctx, obj, opts...)
			}
			token, err := f.token()
			if err != nil {
				return err
			}
			setToken(obj, token)
			return f.denied(c.Update(ctx, obj, opts...))
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if !f.o.all && !Fenced(obj) && !unknown(obj) {
				return c.Patch(ctx, obj, patch, opts...)
			}
			token, err := f.token()
			if err != nil {
				return err
			}
			setToken(obj, token) // a patch computed from obj (MergeFrom, Apply) carries it
			return f.denied(c.Patch(ctx, obj, stamped{patch, token}, opts...))
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			return f.apply(ctx, obj, func() error { return c.Apply(ctx, obj, opts...) })
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if !f.o.all && !Fenced(obj) && !unknown(obj) {
				return c.Delete(ctx, obj, opts...)
			}
			return f.delete(ctx, c, obj, opts)
		},
		DeleteAllOf: func(_ context.Context, _ client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error {
			do := (&client.DeleteAllOfOptions{}).ApplyOptions(opts)
			return &UnfencedRequest{Method: "DELETE", Path: fmt.Sprintf("all %T in namespace %q", obj, do.Namespace)}
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj, body client.Object, opts ...client.SubResourceCreateOption) error {
			return f.subresource(obj, func() error { return c.SubResource(sub).Create(ctx, obj, body, opts...) })
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return f.subresource(obj, func() error { return c.SubResource(sub).Update(ctx, obj, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return f.subresource(obj, func() error { return c.SubResource(sub).Patch(ctx, obj, patch, opts...) })
		},
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			fencedOrBare, err := applyFenced(obj)
			if err != nil {
				return err
			}
			return f.asIs(fencedOrBare, func() error { return c.SubResource(sub).Apply(ctx, obj, opts...) })
		},
	}
}

// subresource sends a status or scale write unchanged: the API server drops metadata changes
// of a status write and a Scale has no annotations (a JSON patch adding one would fail), so
// no token rides along; the fence decides it by who writes (docs/fenced-objects.md, "Status
// writes", "Scale writes"). For a fenced object, or one passed with no labels and no
// annotations (it may be a fenced one), it is sent only while the grant is held (the same
// efficiency check as the main resource's writes).
func (f *fence) subresource(obj client.Object, send func() error) error {
	return f.asIs(Fenced(obj) || unknown(obj), send)
}

// asIs sends a write unchanged, when fencedOrUnknown (or WithAllObjects) only while the grant
// is held.
func (f *fence) asIs(fencedOrUnknown bool, send func() error) error {
	if f.o.all || fencedOrUnknown {
		if _, err := f.token(); err != nil {
			return err
		}
	}
	return f.denied(send())
}

// applyFenced reports whether an apply configuration shows the lease label or a token, or
// shows no labels and no annotations (a status apply names the object only: it may be a
// fenced one).
func applyFenced(obj runtime.ApplyConfiguration) (bool, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return false, err
	}
	var doc struct {
		Metadata struct {
			Labels      map[string]any `json:"labels"`
			Annotations map[string]any `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return false, cannotStamp("apply configuration %T: %v", obj, err)
	}
	_, labelled := doc.Metadata.Labels[LeaseLabel]
	_, stamped := doc.Metadata.Annotations[TokenAnnotation]
	bare := len(doc.Metadata.Labels) == 0 && len(doc.Metadata.Annotations) == 0
	return labelled || stamped || bare, nil
}

// apply stamps a server-side apply configuration (typed or unstructured) in place: its JSON
// gets the annotation and is read back into it, so the reply still fills it.
func (f *fence) apply(ctx context.Context, obj runtime.ApplyConfiguration, send func() error) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return err
	}
	meta, _ := doc["metadata"].(map[string]any)
	labels, _ := meta["labels"].(map[string]any)
	annotations, _ := meta["annotations"].(map[string]any)
	_, labelled := labels[LeaseLabel]
	_, stampedBefore := annotations[TokenAnnotation]
	if !f.o.all && !labelled && !stampedBefore {
		return send()
	}
	token, err := f.token()
	if err != nil {
		return err
	}
	add := map[string]any{"metadata": map[string]any{"annotations": map[string]any{TokenAnnotation: token}}}
	raw, err = json.Marshal(add)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, obj); err != nil {
		return cannotStamp("apply configuration %T: %v", obj, err)
	}
	_ = ctx
	return f.denied(send())
}

// delete is the Python client's delete plan: a merge patch that writes this holder's token
// (the webhook checks the stored token of a delete), then the delete with that write's
// resourceVersion as precondition, so no other write slips in between. A resourceVersion or
// UID precondition the caller gave applies to the patch too.
func (f *fence) delete(ctx context.Context, c client.WithWatch, obj client.Object, opts []client.DeleteOption) error {
	token, err := f.token()
	if err != nil {
		return err
	}
	do := (&client.DeleteOptions{}).ApplyOptions(opts)
	meta := map[string]any{"annotations": map[string]any{TokenAnnotation: token}}
	if p := do.Preconditions; p != nil {
		if p.ResourceVersion != nil {
			meta["resourceVersion"] = *p.ResourceVersion
		}
		if p.UID != nil {
			meta["uid"] = string(*p.UID)
		}
	}
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	patched, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return cannotStamp("%T is not a client.Object", obj)
	}
	var patchOpts []client.PatchOption
	if len(do.DryRun) > 0 {
		patchOpts = append(patchOpts, client.DryRunAll)
	}
	if err := c.Patch(ctx, patched, client.RawPatch(types.MergePatchType, body), patchOpts...); err != nil {
		return f.denied(err)
	}
	if len(do.DryRun) == 0 { // a dry-run patch stored nothing: no version to hold the delete to
		version := patched.GetResourceVersion()
		pre := client.Preconditions{ResourceVersion: &version}
		if do.Preconditions != nil && do.Preconditions.UID != nil {
			pre.UID = do.Preconditions.UID
		}
		opts = append(opts, pre)
	}
	setToken(obj, token)
	return f.denied(c.Delete(ctx, obj, opts...))
}
