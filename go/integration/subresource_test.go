package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"sync/atomic"
	"testing"

	"github.com/fencedlease/fencedlease/go/fenced"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestSubresourcesAsPod: a Pod's status merge patch and scale JSON patch of the Deployment
// "web" through the fenced client, sent unchanged and decided by who writes
// (docs/fenced-objects.md, "Status writes", "Scale writes"). The Pod is impersonated:
// FENCEDLEASE_GO_IT_IMPERSONATE is a rest.ImpersonationConfig as JSON (UserName, Groups,
// Extra with the Pod's name and UID). FENCEDLEASE_GO_IT_EXPECT is the decision both writes
// must get: "allowed", or the typed refusal "stale_fence" or "holder_mismatch". A DeleteAllOf
// is refused before any DELETE is sent. Logs "status: <decision>" and "scale: <decision>".
func TestSubresourcesAsPod(t *testing.T) {
	ctx, cfg, ns, src := setup(t, "subresources")
	if err := json.Unmarshal([]byte(os.Getenv("FENCEDLEASE_GO_IT_IMPERSONATE")), &cfg.Impersonate); err != nil {
		t.Fatalf("FENCEDLEASE_GO_IT_IMPERSONATE: %v", err)
	}
	if cfg.Impersonate.UserName == "" {
		t.Fatal("FENCEDLEASE_GO_IT_IMPERSONATE names no user")
	}
	expect := os.Getenv("FENCEDLEASE_GO_IT_EXPECT")
	var deletes atomic.Int64
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodDelete {
				deletes.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	base, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := fenced.Wrap(base, src)
	web := &appsv1.Deployment{}
	web.Namespace, web.Name = ns, "web"

	status := client.RawPatch(types.MergePatchType, []byte(`{"status":{"replicas":3}}`))
	decided(t, "status", expect, c.Status().Patch(ctx, web.DeepCopy(), status))
	scale := client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec/replicas","value":2}]`))
	decided(t, "scale", expect, c.SubResource("scale").Patch(ctx, web.DeepCopy(), scale,
		client.WithSubResourceBody(&autoscalingv1.Scale{})))

	if err := c.DeleteAllOf(ctx, &appsv1.Deployment{}, client.InNamespace(ns)); !fenced.IsUnfencedRequest(err) {
		t.Errorf("DeleteAllOf: %v, want IsUnfencedRequest", err)
	}
	if n := deletes.Load(); n != 0 {
		t.Errorf("%d DELETE requests were sent", n)
	}
}

// decided checks a subresource write's outcome against expect, the typed way.
func decided(t *testing.T, what, expect string, err error) {
	t.Helper()
	got := "allowed"
	if err != nil {
		d, ok := fenced.AsDenial(err)
		if !ok {
			t.Errorf("%s: %v, not a fence denial (want %s)", what, err, expect)
			return
		}
		got = d.Code
		typed := map[string]bool{
			fenced.CodeStaleFence:     fenced.IsStaleFence(err),
			fenced.CodeHolderMismatch: fenced.IsHolderMismatch(err),
		}
		if !typed[got] {
			t.Errorf("%s: %v, not typed as %s", what, err, got)
		}
	}
	t.Logf("%s: %s", what, got)
	if got != expect {
		t.Errorf("%s: %s (%v), want %s", what, got, err, expect)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
