// Package grant reads the grant a holder Pod was given from its downward-API files
// (docs/downward-api.md) with the same validation as the Python client
// (fencedlease.client.grant, fencedlease.client.validation), and watches them.
//
// The files lag and a paused process reads nothing: a grant is evidence, not permission.
// Use it to avoid wasted work; safety comes from the fence at the resource (package fenced).
package grant

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// DefaultDir is where the downward-API volume is mounted by the project's examples and chart.
const DefaultDir = "/etc/fencedlease"

// MaxToken is the largest token: etcd revisions are int64.
const MaxToken = 1<<63 - 1

// The file of each field in the downward-API directory.
const (
	FileToken      = "token"
	FileLeaseID    = "lease-id"
	FileValidUntil = "valid-until"
	FileState      = "state"
)

// Files lists the four files, in the order they are read.
var Files = []string{FileToken, FileLeaseID, FileValidUntil, FileState}

// Status is what a grant means now.
type Status string

const (
	StatusHeld    Status = "held"    // state held, deadline not passed
	StatusLost    Status = "lost"    // state lost (or anything but "held")
	StatusExpired Status = "expired" // state held, valid-until passed
	StatusAbsent  Status = "absent"  // nothing granted
)

// Grant is one generation of a lease as given to this holder.
type Grant struct {
	Token      int64
	LeaseID    string
	ValidUntil time.Time // the operator's conservative deadline (UTC)
	State      string    // as written: "held", or "lost"
	Lease      string    // the FencedLease name, when known (the files do not carry it)
	Source     string    // where it was read
}

// Status says whether the grant is held at now.
func (g Grant) Status(now time.Time) Status {
	if g.State != "held" {
		return StatusLost
	}
	if !now.Before(g.ValidUntil) {
		return StatusExpired
	}
	return StatusHeld
}

// Remaining is the time until ValidUntil (0 when lost or past): an efficiency check before
// expensive work, not a safety check.
func (g Grant) Remaining(now time.Time) time.Duration {
	if g.State != "held" || !now.Before(g.ValidUntil) {
		return 0
	}
	return g.ValidUntil.Sub(now)
}

// SameGeneration reports whether other is the same grant (token and lease id).
func (g Grant) SameGeneration(other Grant) bool {
	return g.Token == other.Token && g.LeaseID == other.LeaseID
}

// Check returns nil if the grant is held at now with at least minRemaining left, else an
// *Error of KindLost or KindExpired.
func (g Grant) Check(now time.Time, minRemaining time.Duration) error {
	lease := g.Lease
	if lease == "" {
		lease = "?"
	}
	switch g.Status(now) {
	case StatusLost:
		return &Error{Kind: KindLost, Source: g.Source, Grant: &g,
			Msg: fmt.Sprintf("lease %s: grant %s (token %d) is lost", lease, g.LeaseID, g.Token)}
	case StatusHeld:
		if g.Remaining(now) >= minRemaining {
			return nil
		}
	}
	return &Error{Kind: KindExpired, Source: g.Source, Grant: &g,
		Msg: fmt.Sprintf("lease %s: grant %s (token %d) has %.1fs left (valid until %s, need %.1fs)",
			lease, g.LeaseID, g.Token, g.Remaining(now).Seconds(),
			g.ValidUntil.UTC().Format(time.RFC3339), minRemaining.Seconds())}
}

var (
	tokenText = regexp.MustCompile(`^[1-9][0-9]{0,18}$`)
	leaseID   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// fileSpace is what the Python client strips around a token and a lease id.
const fileSpace = " \t\r\n"

// pySpace is what Python's str.strip() removes from ASCII text (the state, the time).
const pySpace = " \t\n\r\v\f\x1c\x1d\x1e\x1f"

// ParseToken reads a token written as text: ASCII digits only, no sign, "_" or leading zero,
// 1 to MaxToken; surrounding spaces, tabs and line ends are ignored.
func ParseToken(text string) (int64, error) {
	s := strings.Trim(text, fileSpace)
	if !tokenText.MatchString(s) {
		return 0, fmt.Errorf("invalid token %s: want ASCII digits, 1 to %d", show(s), int64(MaxToken))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil { // 19 digits above MaxToken
		return 0, fmt.Errorf("invalid token %s: want ASCII digits, 1 to %d", show(s), int64(MaxToken))
	}
	return n, nil
}

// ParseLeaseID checks a grant's lease id as the operator writes it (ASCII letters, digits,
// "._-", at most 64, not starting with a punctuation mark).
func ParseLeaseID(value string) (string, error) {
	if !leaseID.MatchString(value) {
		return "", fmt.Errorf("invalid lease id %s", show(value))
	}
	return value, nil
}

var isoTime = regexp.MustCompile(`^(\d{4})-(\d{2})-(\d{2})(?:[^0-9](\d{2})(?::(\d{2})(?::(\d{2})(?:[.,](\d+))?)?)?([+-]\d{2}(?::?\d{2}(?::?\d{2}(?:\.\d{1,6})?)?)?)?)?$`)

// ParseTime reads an ISO 8601 time as the Python client does (datetime.fromisoformat after
// "Z" becomes "+00:00"): a date, or a date, one separator character and a time (HH, HH:MM or
// HH:MM:SS, with an optional fraction kept to microseconds) and an optional UTC offset
// (+HH, +HH:MM, +HHMM, +HH:MM:SS); without an offset it is UTC. The result is in UTC. The
// compact forms (20261207T040506) are not read: the operator writes RFC 3339.
func ParseTime(value string) (time.Time, error) {
	s := strings.ReplaceAll(strings.Trim(value, pySpace), "Z", "+00:00")
	m := isoTime.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, fmt.Errorf("invalid isoformat string: %s", show(s))
	}
	num := func(i int) int {
		if m[i] == "" {
			return 0
		}
		n, _ := strconv.Atoi(m[i])
		return n
	}
	nanos := 0
	if frac := m[7]; frac != "" {
		frac = (frac + "000000000")[:9]
		nanos, _ = strconv.Atoi(frac)
		nanos = nanos / 1000 * 1000 // Python keeps microseconds
	}
	loc := time.UTC
	if off := m[8]; off != "" {
		digits := strings.ReplaceAll(off[1:], ":", "")
		h, _ := strconv.Atoi(digits[0:2])
		mi := 0
		if len(digits) >= 4 {
			mi, _ = strconv.Atoi(digits[2:4])
		}
		sec := 0
		if len(digits) >= 6 {
			sec, _ = strconv.Atoi(digits[4:6])
		}
		total := h*3600 + mi*60 + sec
		if h > 23 || mi > 59 || sec > 59 {
			return time.Time{}, fmt.Errorf("invalid isoformat string: %s", show(s))
		}
		if off[0] == '-' {
			total = -total
		}
		loc = time.FixedZone("", total)
	}
	y, mo, d, h, mi, sec := num(1), num(2), num(3), num(4), num(5), num(6)
	t := time.Date(y, time.Month(mo), d, h, mi, sec, nanos, loc)
	if y < 1 || t.Year() != y || int(t.Month()) != mo || t.Day() != d || t.Hour() != h || t.Minute() != mi || t.Second() != sec {
		return time.Time{}, fmt.Errorf("invalid isoformat string: %s", show(s))
	}
	return t.UTC(), nil
}

// Parse makes a grant from the four values (keyed by file name: token, lease-id,
// valid-until, state). It returns nil, nil if there is no token (not granted yet), and an
// *Error of KindMalformed if a value is invalid.
func Parse(values map[string]string, lease, source string) (*Grant, error) {
	tokenText := strings.Trim(values[FileToken], fileSpace)
	if tokenText == "" {
		return nil, nil
	}
	token, err := ParseToken(tokenText)
	if err != nil {
		return nil, malformed(source, "%v", err)
	}
	id, err := ParseLeaseID(strings.Trim(values[FileLeaseID], fileSpace))
	if err != nil {
		return nil, malformed(source, "%v", err)
	}
	until, err := ParseTime(values[FileValidUntil])
	if err != nil {
		return nil, malformed(source, "%v", err)
	}
	state := strings.Trim(values[FileState], pySpace)
	if state == "" {
		state = "held"
	}
	return &Grant{Token: token, LeaseID: id, ValidUntil: until, State: state, Lease: lease, Source: source}, nil
}

// show renders a refused value bounded and printable, for a one-line message.
func show(value string) string {
	q := strconv.QuoteToASCII(value)
	if len(q) > 80 {
		return q[:77] + "..."
	}
	return q
}
