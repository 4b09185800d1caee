package fenced

import (
	"encoding/json"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

type restConfig = rest.Config

var errNoWatch = cannotStamp("this client has no Watch")

// stamped is a patch whose data carries the token, whatever its type.
type stamped struct {
	client.Patch
	token string
}

func (p stamped) Data(obj client.Object) ([]byte, error) {
	data, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	return stampBody(data, string(p.Type()), p.token)
}

// stampBody returns a write's body with the token: a JSON patch gets an "add" operation, any
// other body (an object, a merge or strategic merge patch, an apply patch in JSON or YAML)
// metadata.annotations. Pure.
func stampBody(body []byte, contentType, token string) ([]byte, error) {
	ct := strings.TrimSpace(strings.SplitN(contentType, ";", 2)[0])
	if ct == string(types.JSONPatchType) {
		var ops []any
		if len(strings.TrimSpace(string(body))) > 0 {
			if err := json.Unmarshal(body, &ops); err != nil {
				return nil, cannotStamp("JSON patch: %v", err)
			}
		}
		path := "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(TokenAnnotation, "~", "~0"), "/", "~1")
		ops = append(ops, map[string]any{"op": "add", "path": path, "value": token})
		return json.Marshal(ops)
	}
	switch ct {
	case "", "application/json", string(types.MergePatchType), string(types.StrategicMergePatchType), string(types.ApplyYAMLPatchType), string(types.ApplyCBORPatchType):
	default:
		return nil, cannotStamp("content type %q", contentType)
	}
	if ct == string(types.ApplyYAMLPatchType) {
		converted, err := yaml.YAMLToJSON(body)
		if err != nil {
			return nil, cannotStamp("apply patch: %v", err)
		}
		body = converted
	} else if ct == string(types.ApplyCBORPatchType) {
		return nil, cannotStamp("content type %q", contentType)
	}
	var doc map[string]any
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := json.Unmarshal(body, &doc); err != nil {
			return nil, cannotStamp("body is not a JSON object: %v", err)
		}
	}
	if doc == nil {
		doc = map[string]any{}
	}
	meta, _ := doc["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		doc["metadata"] = meta
	}
	annotations, _ := meta["annotations"].(map[string]any)
	if annotations == nil {
		annotations = map[string]any{}
		meta["annotations"] = annotations
	}
	annotations[TokenAnnotation] = token
	return json.Marshal(doc)
}
