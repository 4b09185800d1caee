package grant

import (
	"errors"
	"fmt"
	"testing"
)

func asError(err error, target **Error) bool { return errors.As(err, target) }

func TestErrorKindsMatchTheirSentinelOnly(t *testing.T) {
	sentinels := map[Kind]error{KindAbsent: ErrAbsent, KindLost: ErrLost, KindExpired: ErrExpired, KindMalformed: ErrMalformed}
	for kind := range sentinels {
		err := fmt.Errorf("wrapped: %w", &Error{Kind: kind, Msg: "m"})
		for other, s := range sentinels {
			if got := errors.Is(err, s); got != (other == kind) {
				t.Errorf("%v is %v: %v", kind, other, got)
			}
		}
		if !IsGrantError(err) || kind.String() == "" {
			t.Errorf("%v", kind)
		}
	}
	if IsGrantError(errors.New("other")) || IsLost(nil) {
		t.Error("a foreign error is no grant error")
	}
}
