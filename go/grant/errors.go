package grant

import (
	"errors"
	"fmt"
)

// Kind says why there is no usable grant.
type Kind int

const (
	// KindAbsent: nothing granted (no files, or an empty token file).
	KindAbsent Kind = iota + 1
	// KindLost: the operator wrote `state: lost` (expired, released, force-released or
	// handed over).
	KindLost
	// KindExpired: `state: held` but `valid-until` has passed (the operator may not have
	// said so yet), or less than the asked minimum remains.
	KindExpired
	// KindMalformed: the files are there but do not hold a valid grant (not ASCII, a token
	// that is not `[1-9][0-9]{0,18}`, a bad lease id or time), or cannot be read.
	KindMalformed
)

func (k Kind) String() string {
	switch k {
	case KindAbsent:
		return "absent"
	case KindLost:
		return "lost"
	case KindExpired:
		return "expired"
	case KindMalformed:
		return "malformed"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// The sentinels an *Error matches with errors.Is.
var (
	ErrAbsent    = errors.New("grant absent")
	ErrLost      = errors.New("grant lost")
	ErrExpired   = errors.New("grant expired")
	ErrMalformed = errors.New("grant malformed")
)

// Error is every error this package returns about a grant: its Kind, where it was read
// (Source), the grant when there was one (lost or expired), and a one-line message.
type Error struct {
	Kind   Kind
	Source string
	Grant  *Grant
	Msg    string
	Err    error
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the cause (an I/O error), when there is one.
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrLost) and the like true for an *Error of that Kind.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrAbsent:
		return e.Kind == KindAbsent
	case ErrLost:
		return e.Kind == KindLost
	case ErrExpired:
		return e.Kind == KindExpired
	case ErrMalformed:
		return e.Kind == KindMalformed
	}
	return false
}

// IsAbsent reports whether err says nothing is granted.
func IsAbsent(err error) bool { return errors.Is(err, ErrAbsent) }

// IsLost reports whether err says the operator marked the grant lost.
func IsLost(err error) bool { return errors.Is(err, ErrLost) }

// IsExpired reports whether err says the grant's deadline passed (or too little remains).
func IsExpired(err error) bool { return errors.Is(err, ErrExpired) }

// IsMalformed reports whether err says the files do not hold a valid grant.
func IsMalformed(err error) bool { return errors.Is(err, ErrMalformed) }

// IsGrantError reports whether err is any of this package's errors: there is no held grant.
func IsGrantError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

func malformed(source, format string, args ...any) *Error {
	return &Error{Kind: KindMalformed, Source: source, Msg: source + ": malformed grant: " + fmt.Sprintf(format, args...)}
}
