package fenced

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/fencedlease/fencedlease/go/grant"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

type seen struct {
	method, path, query, contentType, body string
}

// apiServer answers every request with a ConfigMap at resourceVersion 7 (or the status
// answer), recording what it got.
func apiServer(t *testing.T, answer func(r *http.Request) (int, any)) (*rest.Config, *[]seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), string(body)})
		mu.Unlock()
		code, out := 200, any(&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns", ResourceVersion: "7"}})
		if answer != nil {
			code, out = answer(r)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL}, &got
}

func TestRoundTripperStampsWritesAndPlansDeletes(t *testing.T) {
	ctx := context.Background()
	cfg, got := apiServer(t, nil)
	cs := kubernetes.NewForConfigOrDie(WrapConfig(cfg, &held{token: 70}))
	cms := cs.CoreV1().ConfigMaps("ns")
	if _, err := cms.Create(ctx, cm("x", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Create(ctx, cm("plain", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Patch(ctx, "x", types.JSONPatchType, []byte(`[]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	status := cs.CoreV1().RESTClient().Put().AbsPath("/api/v1/namespaces/ns/configmaps/x/status").
		SetHeader("Content-Type", "application/json").Body([]byte(`{"metadata":{"labels":{"fencedlease.io/lease":"l"}}}`))
	if err := status.Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "x", metav1.DeleteOptions{PropagationPolicy: new(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	if err := cms.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); !IsUnfencedRequest(err) {
		t.Errorf("collection delete: %v", err)
	}
	r := *got
	if len(r) != 6 {
		t.Fatalf("requests %+v", r)
	}
	if !strings.Contains(r[0].body, `"fencedlease.io/token":"70"`) || strings.Contains(r[1].body, "fencedlease.io/token") {
		t.Errorf("creates: %s / %s", r[0].body, r[1].body)
	}
	if r[2].body != `[{"op":"add","path":"/metadata/annotations/fencedlease.io~1token","value":"70"}]` {
		t.Errorf("JSON patch %s", r[2].body)
	}
	if !strings.HasSuffix(r[3].path, "/status") || strings.Contains(r[3].body, "fencedlease.io/token") {
		t.Errorf("status write changed: %+v", r[3])
	}
	if r[4].method != "PATCH" || r[4].contentType != string(types.MergePatchType) || r[4].body != `{"metadata":{"annotations":{"fencedlease.io/token":"70"}}}` {
		t.Errorf("delete's token patch %+v", r[4])
	}
	var opts metav1.DeleteOptions
	if err := json.Unmarshal([]byte(r[5].body), &opts); err != nil || r[5].method != "DELETE" ||
		opts.Preconditions == nil || *opts.Preconditions.ResourceVersion != "7" || *opts.PropagationPolicy != metav1.DeletePropagationForeground {
		t.Errorf("delete %+v (%v)", r[5], err)
	}
}

func TestRoundTripperSendsNothingWithoutAGrantAndReportsDenials(t *testing.T) {
	ctx := context.Background()
	cfg, got := apiServer(t, func(r *http.Request) (int, any) {
		return 403, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Code: 403, Reason: "Forbidden",
			Message: `admission webhook "fence.fencedlease.io" denied the request: holder_mismatch: token 70 is Pod a's`}
	})
	src := &held{err: &grant.Error{Kind: grant.KindLost, Msg: "lost"}}
	var denied []string
	cs := kubernetes.NewForConfigOrDie(WrapConfig(cfg, src, WithDenialHandler(func(d *Denial) { denied = append(denied, d.Code) })))
	if _, err := cs.CoreV1().ConfigMaps("ns").Create(ctx, cm("x", true), metav1.CreateOptions{}); !grant.IsLost(err) {
		t.Fatalf("lost grant: %v", err)
	}
	if len(*got) != 0 {
		t.Fatalf("sent %+v", *got)
	}
	src.set(70, nil)
	_, err := cs.CoreV1().ConfigMaps("ns").Create(ctx, cm("x", true), metav1.CreateOptions{})
	if !IsHolderMismatch(err) || len(denied) != 1 || denied[0] != CodeHolderMismatch {
		t.Fatalf("%v %v", err, denied)
	}
	if err := cs.CoreV1().ConfigMaps("ns").Delete(ctx, "x", metav1.DeleteOptions{}); !IsHolderMismatch(err) || len(*got) != 2 {
		t.Fatalf("a refused token patch ends the delete: %v, %d requests", err, len(*got))
	}
}

func TestTarget(t *testing.T) {
	for path, want := range map[string][3]string{
		"/api/v1/namespaces/ns/configmaps":                {"configmaps", "", ""},
		"/api/v1/namespaces/ns/configmaps/x":              {"configmaps", "x", ""},
		"/apis/apps/v1/namespaces/ns/deployments/d/scale": {"deployments", "d", "scale"},
		"/api/v1/namespaces/ns":                           {"namespaces", "ns", ""},
		"/api/v1/namespaces/ns/status":                    {"namespaces", "ns", "status"},
		"/apis/fencedlease.io/v1alpha1/fencepolicies/p":   {"fencepolicies", "p", ""},
	} {
		r, n, s, ok := target(path)
		if !ok || [3]string{r, n, s} != want {
			t.Errorf("%s: %s %s %s %v", path, r, n, s, ok)
		}
	}
	if _, _, _, ok := target("/healthz"); ok {
		t.Error("/healthz")
	}
}
