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
	"unicode/utf8"
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

var (
	isoDate = regexp.MustCompile(`^(?:(\d{4})-(\d{2})-(\d{2})|(\d{4})(\d{2})(\d{2})|(\d{4})-W(\d{2})(?:-(\d))?|(\d{4})W(\d{2})(\d)?)`)
	isoTime = longest(`^(?:(\d{2})(?::(\d{2})(?::(\d{2})(?:[.,](\d+))?)?)?|(\d{2})(?:(\d{2})(?:(\d{2})(?:[.,](\d+))?)?)?)`)
	isoZone = regexp.MustCompile(`^([+-])(\d{2})(?::?(\d{2})(?::?(\d{2})(?:\.(\d{1,6}))?)?)?$`)
)

// ParseTime reads an ISO 8601 time as the Python client does (datetime.fromisoformat of
// Python 3.11+, after "Z" becomes "+00:00"): a calendar date (2026-12-07, 20261207) or an ISO
// week date (2026-W49-1, 2026W491), optionally one separator character and a time (04,
// 04:05, 04:05:06, 040506, with a fraction kept to microseconds) and a UTC offset (+01,
// +01:00, +0100, +01:00:30); without an offset it is UTC. The result is in UTC.
// tests/unit/test_go_grant_parity.py compares it with Python on a corpus.
func ParseTime(value string) (time.Time, error) {
	s := strings.ReplaceAll(strings.Trim(value, pySpace), "Z", "+00:00")
	bad := fmt.Errorf("invalid isoformat string: %s", show(s))
	d := isoDate.FindStringSubmatch(s)
	if d == nil {
		return time.Time{}, bad
	}
	day, ok := isoDay(d)
	if !ok {
		return time.Time{}, bad
	}
	rest := s[len(d[0]):]
	if rest == "" {
		return day, nil
	}
	_, size := utf8.DecodeRuneInString(rest) // any one separator character
	rest = rest[size:]
	t := isoTime.FindStringSubmatch(rest)
	if t == nil || t[0] == "" {
		return time.Time{}, bad
	}
	f := t[1:5]
	if t[1] == "" {
		f = t[5:9]
	}
	h, mi, sec := atoi(f[0]), atoi(f[1]), atoi(f[2])
	if h > 23 || mi > 59 || sec > 59 {
		return time.Time{}, bad
	}
	nanos := 0
	if frac := f[3]; frac != "" {
		nanos = atoi((frac + "000000")[:6]) * 1000 // Python keeps microseconds
	}
	at := day.Add(time.Duration(h)*time.Hour + time.Duration(mi)*time.Minute + time.Duration(sec)*time.Second + time.Duration(nanos))
	zone := rest[len(t[0]):]
	if zone == "" {
		return at, nil
	}
	z := isoZone.FindStringSubmatch(zone)
	if z == nil {
		return time.Time{}, bad
	}
	zh, zm, zs := atoi(z[2]), atoi(z[3]), atoi(z[4])
	if zh > 23 || zm > 59 || zs > 59 {
		return time.Time{}, bad
	}
	offset := time.Duration(zh)*time.Hour + time.Duration(zm)*time.Minute + time.Duration(zs)*time.Second
	if z[5] != "" {
		offset += time.Duration(atoi((z[5] + "000000")[:6])) * time.Microsecond
	}
	if z[1] == "-" {
		offset = -offset
	}
	return at.Add(-offset), nil
}

// isoDay is the UTC midnight of a matched calendar or week date (false if no such day).
func isoDay(d []string) (time.Time, bool) {
	if d[1] != "" || d[4] != "" {
		y, m, dd := d[1], d[2], d[3]
		if y == "" {
			y, m, dd = d[4], d[5], d[6]
		}
		year, month, day := atoi(y), atoi(m), atoi(dd)
		t := time.Date(year, time.Month(month), day, 0, 0, 0, 0, time.UTC)
		return t, year >= 1 && t.Year() == year && int(t.Month()) == month && t.Day() == day
	}
	y, w, wd := d[7], d[8], d[9]
	if y == "" {
		y, w, wd = d[10], d[11], d[12]
	}
	year, week, weekday := atoi(y), atoi(w), 1
	if wd != "" {
		weekday = atoi(wd)
	}
	if year < 1 || week < 1 || week > 53 || weekday < 1 || weekday > 7 {
		return time.Time{}, false
	}
	jan4 := time.Date(year, 1, 4, 0, 0, 0, 0, time.UTC)
	monday := jan4.AddDate(0, 0, -((int(jan4.Weekday()) + 6) % 7))
	t := monday.AddDate(0, 0, (week-1)*7+weekday-1)
	isoYear, _ := t.ISOWeek()
	return t, isoYear == year
}

// longest compiles expr to match the longest alternative (04:05:06, not 04 then ":05:06").
func longest(expr string) *regexp.Regexp {
	r := regexp.MustCompile(expr)
	r.Longest()
	return r
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
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
