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
// controller-runtime (client-go's typed and dynamic clients): every POST, PUT and PATCH of an
// object carries the token, a DELETE of one object is the delete plan (token, then
// resourceVersion precondition), a collection DELETE is refused (ErrCollectionDelete),
// subresource writes (status, scale) pass as they are. Bodies must be JSON (or YAML for
// apply): the copy asks for JSON; a protobuf or CBOR body is refused (ErrCannotStamp).
// POST and PUT bodies are stamped when they show the lease label or a token (or always,
// WithAllObjects); a PATCH or DELETE cannot show the stored object, so it is always fenced.
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
// for paths that are not a resource (discovery, /healthz...).
func target(path string) (resource, name, sub string, ok bool) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	var rest []string
	switch {
	case len(segs) >= 3 && segs[0] == "api":
		rest = segs[2:]
	case len(segs) >= 4 && segs[0] == "apis":
		rest = segs[3:]
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
	default:
		return rest[0], rest[1], strings.Join(rest[2:], "/"), true
	}
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resource, name, sub, ok := target(req.URL.Path)
	method := req.Method
	if !ok || sub != "" || (method != http.MethodPost && method != http.MethodPut && method != http.MethodPatch && method != http.MethodDelete) {
		return t.send(req)
	}
	if method == http.MethodDelete {
		if name == "" {
			return nil, fmt.Errorf("%s %s: %w", method, req.URL.Path, ErrCollectionDelete)
		}
		return t.delete(req)
	}
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	if method != http.MethodPatch && !t.f.o.all && !bodyFenced(body) {
		return t.send(withBody(req, body))
	}
	token, err := t.f.token()
	if err != nil {
		return nil, err
	}
	out, err := stampBody(body, req.Header.Get("Content-Type"), token)
	if err != nil {
		return nil, fmt.Errorf("%s %s %s: %w", method, resource, name, err)
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
	var obj struct {
		Metadata struct {
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if json.Unmarshal(body, &obj) != nil {
		return true // not JSON: stampBody says why
	}
	_, labelled := obj.Metadata.Labels[LeaseLabel]
	_, stamped := obj.Metadata.Annotations[TokenAnnotation]
	return labelled || stamped
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
