package grant

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

var now = time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)

// writeDir writes a fake downward-API directory; a nil value leaves the file out.
func writeDir(t *testing.T, dir string, files map[string][]byte) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if data == nil {
			continue
		}
		// Atomically, as the kubelet's writer does (a reader never sees a half-written file).
		tmp := filepath.Join(dir, ".tmp-"+name)
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func held(token string, until time.Time) map[string][]byte {
	return map[string][]byte{
		FileToken:      []byte(token),
		FileLeaseID:    []byte("5f3a9c0d12ab\n"),
		FileValidUntil: []byte(until.Format(time.RFC3339)),
		FileState:      []byte("held"),
	}
}

func TestParseTokenRefusesWhatIsNotASCIIDigits(t *testing.T) {
	for _, text := range []string{"٧٥٢", "7_52", "+752", "-752", "0752", "0", "7.5", "7e2", "0x2f0",
		"752 1", "", "９", "²", strconv.FormatUint(MaxToken+1, 10), "11111111111111111111111111111111111111"} {
		if n, err := ParseToken(text); err == nil {
			t.Errorf("ParseToken(%q) = %d, want an error", text, n)
		}
	}
}

func TestParseTokenIgnoresSurroundingSpace(t *testing.T) {
	for text, want := range map[string]int64{"752\n": 752, " 752\r\n": 752, "\t9223372036854775807": MaxToken} {
		if n, err := ParseToken(text); err != nil || n != want {
			t.Errorf("ParseToken(%q) = %d, %v; want %d", text, n, err, want)
		}
	}
	if _, err := ParseToken("752\v"); err == nil { // only " \t\r\n" are stripped
		t.Error(`ParseToken("752\v") accepted`)
	}
}

func TestParseLeaseID(t *testing.T) {
	for _, ok := range []string{"a", "5f3a9c0d12ab", "A.b_c-d", string(make64('x'))} {
		if _, err := ParseLeaseID(ok); err != nil {
			t.Errorf("ParseLeaseID(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", ".a", "a b", "a/b", "é", string(make64('x')) + "x"} {
		if _, err := ParseLeaseID(bad); err == nil {
			t.Errorf("ParseLeaseID(%q) accepted", bad)
		}
	}
}

func make64(c byte) []byte {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return b
}

func TestParseTimeLikeFromisoformat(t *testing.T) {
	want := time.Date(2026, 12, 7, 4, 5, 6, 0, time.UTC)
	for _, text := range []string{"2026-12-07T04:05:06Z", "2026-12-07T04:05:06+00:00", " 2026-12-07T04:05:06Z\n",
		"2026-12-07 04:05:06", "2026-12-07T05:05:06+01:00", "2026-12-07T04:05:06.000000Z", "2026-12-07T03:05:06-0100", "2026-12-07x04:05:06", "2026-12-07T04:05:06+00", "2026-12-07T05:05:36+01:00:30", "20261207T040506", "2026-12-07T040506", "20261207T04:05:06"} {
		got, err := ParseTime(text)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", text, got, err, want)
		}
	}
	if got, err := ParseTime("2026-12-07"); err != nil || !got.Equal(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("date only: %v %v", got, err)
	}
	if got, err := ParseTime("2026-12-07T04:05:06.1234567Z"); err != nil || got.Nanosecond() != 123456000 {
		t.Errorf("fraction kept to microseconds: %v %v", got, err)
	}
	for _, bad := range []string{"", "soon", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-12-07T25:00:00Z",
		"1765080000", "2026-12-07T04:05:06+25:00", "2026-12-07T04:05:06 UTC", "2026-12-07T24:00:00", "2026-12-07T04:0506", "2026-W54-1"} {
		if got, err := ParseTime(bad); err == nil {
			t.Errorf("ParseTime(%q) = %v, want an error", bad, got)
		}
	}
}

func TestReadDirAbsent(t *testing.T) {
	base := t.TempDir()
	for name, files := range map[string]map[string][]byte{
		"missing": nil,
		"empty":   {FileToken: {}, FileLeaseID: {}, FileValidUntil: {}, FileState: {}},
		"blank":   {FileToken: []byte(" \n"), FileLeaseID: []byte("x")},
	} {
		dir := filepath.Join(base, name)
		if files != nil {
			writeDir(t, dir, files)
		}
		g, err := ReadDir(dir, "")
		if g != nil || err != nil {
			t.Errorf("%s: ReadDir = %v, %v; want nil, nil", name, g, err)
		}
		_, err = NewDir(dir, WithClock(func() time.Time { return now })).Current()
		if !IsAbsent(err) || IsLost(err) || !IsGrantError(err) {
			t.Errorf("%s: Current error %v, want absent", name, err)
		}
	}
}

func TestReadDirMalformed(t *testing.T) {
	until := now.Add(time.Minute)
	for name, change := range map[string]map[string][]byte{
		"not utf-8":        {FileToken: []byte("\xff\xfe7")},
		"arabic digits":    {FileToken: []byte("٧٥٢")},
		"underscore":       {FileToken: []byte("7_52")},
		"sign":             {FileToken: []byte("+752")},
		"leading zero":     {FileToken: []byte("0752")},
		"lease id":         {FileLeaseID: []byte("a/b")},
		"lease id missing": {FileLeaseID: nil},
		"lease id utf-8":   {FileLeaseID: []byte("é7")},
		"time":             {FileValidUntil: []byte("tomorrow")},
		"time missing":     {FileValidUntil: nil},
		"state not ascii":  {FileState: []byte("hé")},
	} {
		files := held("752\n", until)
		for k, v := range change {
			files[k] = v
			if v == nil {
				delete(files, k)
			}
		}
		dir := writeDir(t, filepath.Join(t.TempDir(), "g"), files)
		g, err := ReadDir(dir, "")
		if g != nil || !IsMalformed(err) {
			t.Errorf("%s: ReadDir = %v, %v; want malformed", name, g, err)
		}
		if _, err := NewDir(dir).Current(); !IsMalformed(err) {
			t.Errorf("%s: Current error %v, want malformed", name, err)
		}
	}
}

func TestCurrentHeldLostExpired(t *testing.T) {
	clock := func() time.Time { return now }
	dir := writeDir(t, filepath.Join(t.TempDir(), "g"), held("752\n", now.Add(30*time.Second)))
	src := NewDir(dir, WithLease("report-july"), WithClock(clock))
	g, err := src.Current()
	if err != nil || g.Token != 752 || g.LeaseID != "5f3a9c0d12ab" || g.Lease != "report-july" || g.Status(now) != StatusHeld {
		t.Fatalf("held: %+v %v", g, err)
	}
	if g.Remaining(now) != 30*time.Second {
		t.Errorf("remaining %v", g.Remaining(now))
	}
	if err := g.Check(now, time.Minute); !IsExpired(err) {
		t.Errorf("Check with 60s needed: %v, want expired", err)
	}

	writeDir(t, dir, map[string][]byte{FileState: []byte("lost\n")})
	g, err = src.Current()
	if !IsLost(err) || IsExpired(err) || g.Token != 752 {
		t.Errorf("lost: %+v %v", g, err)
	}
	var ge *Error
	if !asError(err, &ge) || ge.Grant == nil || ge.Grant.Token != 752 {
		t.Errorf("a lost error carries the grant: %#v", err)
	}

	writeDir(t, dir, map[string][]byte{FileState: []byte("held"), FileValidUntil: []byte(now.Format(time.RFC3339))})
	if _, err = src.Current(); !IsExpired(err) {
		t.Errorf("valid-until == now: %v, want expired", err)
	}
	writeDir(t, dir, map[string][]byte{FileState: []byte(""), FileValidUntil: []byte(now.Add(time.Second).Format(time.RFC3339))})
	if g, err = src.Current(); err != nil || g.State != "held" {
		t.Errorf("an empty state is held (as the Python client reads it): %+v %v", g, err)
	}
	writeDir(t, dir, map[string][]byte{FileState: []byte("released")})
	if _, err = src.Current(); !IsLost(err) {
		t.Errorf("any state but held is lost: %v", err)
	}
}

func TestRunSeesAChangeAndCurrentAnswersFromIt(t *testing.T) {
	until := time.Now().Add(time.Hour)
	dir := writeDir(t, filepath.Join(t.TempDir(), "g"), held("7", until))
	src := NewDir(dir, WithPollInterval(time.Hour)) // fsnotify alone must see it
	changed, stop := src.Changed()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- src.Run(ctx) }()
	waitFor(t, changed)
	if g, err := src.Current(); err != nil || g.Token != 7 {
		t.Fatalf("first read: %+v %v", g, err)
	}
	// As the kubelet does: new files in a new directory, then the symlink swapped.
	writeDir(t, dir, map[string][]byte{FileToken: []byte("8")})
	waitFor(t, changed)
	if g, err := src.Current(); err != nil || g.Token != 8 {
		t.Fatalf("after the change: %+v %v", g, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRunPollsADirectoryThatAppearsLater(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "later")
	src := NewDir(dir, WithPollInterval(20*time.Millisecond))
	changed, stop := src.Changed()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = src.Run(ctx) }()
	waitFor(t, changed)
	if _, err := src.Current(); !IsAbsent(err) {
		t.Fatalf("before: %v", err)
	}
	writeDir(t, dir, held("9", time.Now().Add(time.Hour)))
	waitFor(t, changed)
	if g, err := src.Current(); err != nil || g.Token != 9 {
		t.Fatalf("after: %+v %v", g, err)
	}
}

func TestWait(t *testing.T) {
	calls := 0
	src := Func(func() (Grant, error) {
		calls++
		if calls < 3 {
			return Grant{}, &Error{Kind: KindAbsent, Msg: "nothing"}
		}
		return Grant{Token: 5, LeaseID: "a", State: "held", ValidUntil: time.Now().Add(time.Hour)}, nil
	})
	g, err := Wait(context.Background(), src, time.Minute, time.Millisecond)
	if err != nil || g.Token != 5 || calls != 3 {
		t.Fatalf("%+v %v %d", g, err, calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	never := Func(func() (Grant, error) { return Grant{}, &Error{Kind: KindLost, Msg: "lost"} })
	if _, err := Wait(ctx, never, 0, time.Millisecond); !IsLost(err) {
		t.Fatalf("Wait until the deadline: %v", err)
	}
}

func waitFor(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no change seen within 10s")
	}
}
