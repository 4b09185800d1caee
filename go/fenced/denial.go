package fenced

import (
	"errors"
	"fmt"
	"regexp"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The codes a fence webhook's denial carries (docs/fenced-objects.md, docs/fenced-publish.md).
const (
	CodeStaleFence     = "stale_fence"     // a newer token reached the object: stop, never retry under this grant
	CodeHolderMismatch = "holder_mismatch" // the token is another Pod's (or this write keeps another's stamp)
	CodeUnknownToken   = "unknown_token"   // the lease never issued this token
	CodeLeaseMismatch  = "lease_mismatch"  // the token is another lease's, or the lease is gone
	CodeDuplicate      = "duplicate"       // the stored object already shows this token and operation id
	CodeInvalid        = "invalid"         // malformed label or annotation (HTTP 422)
	CodeUnavailable    = "unavailable"     // the fence could not decide (HTTP 503): retry later
)

// denialHTTP is the HTTP status each code comes with (operator/fencedlease/webhook/reviews.py).
var denialHTTP = map[string]int32{
	CodeStaleFence: 403, CodeHolderMismatch: 403, CodeUnknownToken: 403, CodeLeaseMismatch: 403,
	CodeDuplicate: 403, CodeInvalid: 422, CodeUnavailable: 503,
}

// The API server reports a webhook's denial as `admission webhook "<name>" denied the
// request: <the webhook's message>`, and the fence webhook's message starts with its code.
// Only the fence's webhooks (named *.fencedlease.io) count.
var denialMessage = regexp.MustCompile(`admission webhook "([A-Za-z0-9.-]*\.)?(fencedlease\.io)" denied the request: ([a-z_]+)(?::|$)`)

// Denial is a write the fence refused: Code is one of the Code* constants. It wraps the API
// server's error (a *apierrors.StatusError), so apierrors.IsForbidden and the like still work.
type Denial struct {
	Code       string
	Webhook    string
	HTTPStatus int32
	Err        error
}

func (d *Denial) Error() string { return d.Err.Error() }

// Unwrap returns the API server's error.
func (d *Denial) Unwrap() error { return d.Err }

// Definitive reports whether retrying the same write under the same grant cannot succeed:
// every code but unavailable (retry later) and duplicate (already applied).
func (d *Denial) Definitive() bool { return d.Code != CodeUnavailable && d.Code != CodeDuplicate }

// AsDenial reads err as a fence denial: a *Denial in its chain, or an API error whose status
// code and webhook message carry a fence code. Any other error (RBAC's Forbidden, a 409
// Conflict, another webhook's denial) is not one.
func AsDenial(err error) (*Denial, bool) {
	if err == nil {
		return nil, false
	}
	var d *Denial
	if errors.As(err, &d) {
		return d, true
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return nil, false
	}
	s := status.Status()
	m := denialMessage.FindStringSubmatch(s.Message)
	if m == nil {
		return nil, false
	}
	code := m[3]
	if want, known := denialHTTP[code]; !known || want != s.Code {
		return nil, false
	}
	return &Denial{Code: code, Webhook: m[1] + m[2], HTTPStatus: s.Code, Err: err}, true
}

// Code is the fence code of err ("" when err is not a fence denial).
func Code(err error) string {
	if d, ok := AsDenial(err); ok {
		return d.Code
	}
	return ""
}

// IsFenceDenial reports whether the fence refused the write (any code).
func IsFenceDenial(err error) bool { _, ok := AsDenial(err); return ok }

// IsStaleFence: a newer generation wrote; this grant is over. Stop; do not retry.
func IsStaleFence(err error) bool { return Code(err) == CodeStaleFence }

// IsHolderMismatch: the token is not this Pod's, or the write would keep another writer's
// stamp. Stop leading (another Pod holds the lease).
func IsHolderMismatch(err error) bool { return Code(err) == CodeHolderMismatch }

// IsUnknownToken: the lease never issued this token (a forged or mistyped one).
func IsUnknownToken(err error) bool { return Code(err) == CodeUnknownToken }

// IsLeaseMismatch: the token is another lease's, or the object's lease is gone.
func IsLeaseMismatch(err error) bool { return Code(err) == CodeLeaseMismatch }

// IsDuplicate: the stored object already shows this token and operation id (applied before).
func IsDuplicate(err error) bool { return Code(err) == CodeDuplicate }

// IsInvalid: the fence refused a malformed label or annotation (HTTP 422): fix the write.
func IsInvalid(err error) bool { return Code(err) == CodeInvalid }

// IsUnavailable: the fence could not decide (HTTP 503, etcd or webhook down, or a delete
// whose token the mark does not cover yet): retry with backoff.
func IsUnavailable(err error) bool { return Code(err) == CodeUnavailable }

// ErrUnfencedRequest is what every refusal to send an unfenceable request matches
// (errors.Is): a collection delete, by DeleteAllOf or a collection DELETE through the
// round-tripper. The fence decides each item on its stored token, which other writers may
// have stamped: part of the collection would go and part not. Nothing was sent. List the
// objects and delete each (each a fenced delete), or send the collection delete with a
// client that stamps nothing. The Python client's UnfencedRequest (docs/client.md).
var ErrUnfencedRequest = errors.New("fencedlease: a fenced client does not send a collection delete: list the objects and delete each")

// ErrCollectionDelete is ErrUnfencedRequest (its first name).
//
// Deprecated: use ErrUnfencedRequest and IsUnfencedRequest.
var ErrCollectionDelete = ErrUnfencedRequest

// UnfencedRequest is the request that was refused (nothing sent): Method and Path for the
// round-tripper, Method "DELETE" and Path the object type and namespace for DeleteAllOf. It
// matches ErrUnfencedRequest.
type UnfencedRequest struct {
	Method, Path string
}

func (e *UnfencedRequest) Error() string {
	return fmt.Sprintf("%v (%s %s)", ErrUnfencedRequest, e.Method, e.Path)
}

// Is makes errors.Is(err, ErrUnfencedRequest) hold.
func (e *UnfencedRequest) Is(target error) bool { return target == ErrUnfencedRequest }

// IsUnfencedRequest reports whether err is a request the fenced client refused to send.
func IsUnfencedRequest(err error) bool { return errors.Is(err, ErrUnfencedRequest) }

// IsCollectionDeleteRefused is IsUnfencedRequest (its first name).
//
// Deprecated: use IsUnfencedRequest.
func IsCollectionDeleteRefused(err error) bool { return IsUnfencedRequest(err) }

// ErrCannotStamp is returned when a request body cannot carry the token (a protobuf or CBOR
// body through the round-tripper): nothing was sent.
var ErrCannotStamp = errors.New("fencedlease: cannot stamp the token on this request")

func cannotStamp(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCannotStamp, fmt.Sprintf(format, args...))
}
