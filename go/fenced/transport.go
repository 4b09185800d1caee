package fenced

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/fencedlease/fencedlease/go/grant"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// WrapConfig returns a copy of cfg whose requests are fenced, for clients that do not use
// controller-runtime (client-go's typed and dynamic clients). Each request goes by the path it
// addresses, as the Python client's (docs/client.md, "Fenced clients"): a GET/LIST/WATCH as it
// is; a POST, PUT or PATCH of an object (or collection) carries the token; a DELETE of one
// object is the delete plan (token, then resourceVersion precondition); a write of a
// subresource (status, scale: any verb, any patch type) is sent unchanged, only while the
// grant is held (the fence decides it by who writes); a collection DELETE is refused before
// anything is sent (*UnfencedRequest, IsUnfencedRequest). Bodies must be JSON (or YAML for
// apply): the copy asks for JSON; a protobuf or CBOR body is refused (ErrCannotStamp). POST
// and PUT bodies are stamped when they show the lease label or a token (or always,
// WithAllObjects); a PATCH or DELETE cannot show the stored object, so it is always fenced; a
// subresource write needs the grant unless its body shows an object that is not fenced.
func WrapConfig(cfg *rest.Config, src grant.Source, opts ...Option) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.ContentType = "application/json"
	f := &fence{src: src, o: build(opts)}
	out.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &transport{base: rt, f: f} })
	return out
}

type transport struct {
	base http.RoundTripper
	f    *fence
}

// target splits an API path into resource, name and subresource ("" when absent); ok is false
// for paths that are not a resource (discovery, /healthz, a proxy path...). The Python
// client's target: /api/v1/[namespaces/<ns>/]<resource>[/<name>[/<subresource>]] and
// /apis/<group>/<version>/... alike; /api/v1/namespaces/<name>[/status|/finalize] is the
// namespace.
func target(path string) (resource, name, sub string, ok bool) {
	var segs []string
	for _, s := range strings.Split(path, "/") {
		if s != "" {
			segs = append(segs, s)
		}
	}
	var rest []string
	switch {
	case len(segs) >= 1 && segs[0] == "api":
		rest = segs[min(2, len(segs)):]
	case len(segs) >= 1 && segs[0] == "apis":
		rest = segs[min(3, len(segs)):]
	default:
		return "", "", "", false
	}
	if len(rest) >= 3 && rest[0] == "namespaces" && !(len(rest) == 3 && (rest[2] == "status" || rest[2] == "finalize")) {
		rest = rest[2:]
	}
	switch len(rest) {
	case 1:
		return rest[0], "", "", true
	case 2:
		return rest[0], rest[1], "", true
	case 3:
		return rest[0], rest[1], rest[2], true
	default:
		return "", "", "", false
	}
}

// How the round-tripper sends a request (route).
type route int

const (
	routeRead   route = iota // as it is, no grant needed
	routeStamp               // with the token
	routeDelete              // the delete plan
	routeAsIs                // a subresource write: unchanged, while the grant is held
)

// routeOf is the Python client's _route: how a fenced client sends method path, or the
// *UnfencedRequest of a collection delete (pure).
func routeOf(method, path string) (route, error) {
	write := method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch
	if !write && method != http.MethodDelete {
		return routeRead, nil
	}
	_, name, sub, ok := target(path)
	if method == http.MethodDelete {
		switch {
		case ok && name == "":
			return 0, &UnfencedRequest{Method: method, Path: path}
		case ok && sub == "":
			return routeDelete, nil
		default:
			return routeAsIs, nil
		}
	}
	if ok && sub != "" {
		return routeAsIs, nil
	}
	return routeStamp, nil
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	how, err := routeOf(req.Method, req.URL.Path)
	if err != nil {
		return nil, err
	}
	switch how {
	case routeRead:
		return t.send(req)
	case routeDelete:
		return t.delete(req)
	}
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	if how == routeAsIs {
		if t.f.o.all || !bodyUnfenced(body) {
			if _, err := t.f.token(); err != nil {
				return nil, err
			}
		}
		return t.send(withBody(req, body))
	}
	if req.Method != http.MethodPatch && !t.f.o.all && !bodyFenced(body) {
		return t.send(withBody(req, body))
	}
	token, err := t.f.token()
	if err != nil {
		return nil, err
	}
	out, err := stampBody(body, req.Header.Get("Content-Type"), token)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	next := withBody(req, out)
	if strings.HasPrefix(req.Header.Get("Content-Type"), string(types.ApplyYAMLPatchType)) {
		next.Header.Set("Content-Type", string(types.ApplyYAMLPatchType)) // JSON is YAML
	}
	return t.send(next)
}

// delete: a merge patch writing the token, then the DELETE with its resourceVersion.
func (t *transport) delete(req *http.Request) (*http.Response, error) {
	token, err := t.f.token()
	if err != nil {
		return nil, err
	}
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	var options map[string]any
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &options); err != nil {
			return nil, cannotStamp("DeleteOptions: %v", err)
		}
	}
	if options == nil {
		options = map[string]any{}
	}
	patchBody, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{TokenAnnotation: token}}})
	patch := withBody(req, patchBody)
	patch.Method = http.MethodPatch
	patch.Header.Set("Content-Type", string(types.MergePatchType))
	patch.Header.Set("Accept", "application/json") // its reply is read here
	q := patch.URL.Query()
	for key := range q {
		if key != "dryRun" {
			q.Del(key)
		}
	}
	u := *patch.URL
	u.RawQuery = q.Encode()
	patch.URL = &u
	resp, err := t.send(patch)
	if err != nil || resp.StatusCode >= 300 {
		return resp, err
	}
	var patched metav1.PartialObjectMetadata
	data, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &patched); err != nil {
		return nil, fmt.Errorf("fencedlease: the token patch's reply: %w", err)
	}
	if _, dry := req.URL.Query()["dryRun"]; !dry {
		pre, _ := options["preconditions"].(map[string]any)
		if pre == nil {
			pre = map[string]any{}
		}
		pre["resourceVersion"] = patched.ResourceVersion
		options["preconditions"] = pre
	}
	if _, ok := options["kind"]; !ok {
		options["kind"], options["apiVersion"] = "DeleteOptions", "v1"
	}
	out, _ := json.Marshal(options)
	del := withBody(req, out)
	del.Header.Set("Content-Type", "application/json")
	return t.send(del)
}

// send passes req on, and tells the denial handler about a fence denial in the reply.
func (t *transport) send(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || t.f.o.onDenial == nil || (resp.StatusCode != 403 && resp.StatusCode != 422 && resp.StatusCode != 503) {
		return resp, err
	}
	data, readErr := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(data))
	if readErr != nil {
		return resp, nil
	}
	var status metav1.Status
	if json.Unmarshal(data, &status) == nil && status.Kind == "Status" {
		if d, ok := AsDenial(&apierrors.StatusError{ErrStatus: status}); ok {
			t.f.o.onDenial(d)
		}
	}
	return resp, nil
}

func bodyFenced(body []byte) bool {
	m, ok := bodyMetadata(body)
	if !ok {
		return true // not JSON: stampBody says why
	}
	_, labelled := m.Labels[LeaseLabel]
	_, stamped := m.Annotations[TokenAnnotation]
	return labelled || stamped
}

// bodyUnfenced: the body is an object whose metadata shows labels or annotations, and neither
// the lease label nor a token (a Scale, a patch or DeleteOptions shows none: it may be of a
// fenced object).
func bodyUnfenced(body []byte) bool {
	m, ok := bodyMetadata(body)
	if !ok {
		return false
	}
	if len(m.Labels) == 0 && len(m.Annotations) == 0 {
		return false
	}
	_, labelled := m.Labels[LeaseLabel]
	_, stamped := m.Annotations[TokenAnnotation]
	return !labelled && !stamped
}

// bodyMeta is the part of a request body's metadata that says whether it is fenced.
type bodyMeta struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// bodyMetadata: the labels and annotations of a JSON body's metadata; false if not JSON.
func bodyMetadata(body []byte) (bodyMeta, bool) {
	var obj struct {
		Metadata bodyMeta `json:"metadata"`
	}
	if json.Unmarshal(body, &obj) != nil {
		return bodyMeta{}, false
	}
	return obj.Metadata, true
}

func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	var rc io.ReadCloser = req.Body
	if req.GetBody != nil { // leave the original readable for a retry
		if fresh, err := req.GetBody(); err == nil {
			rc = fresh
		}
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func withBody(req *http.Request, body []byte) *http.Request {
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	out.ContentLength = int64(len(body))
	out.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return out
}
