package grant

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Source is where the current grant comes from.
type Source interface {
	// Current is the grant held now, or an *Error (absent, lost, expired, malformed).
	Current() (Grant, error)
	// Describe names the source for messages.
	Describe() string
}

// ReadDir reads the downward-API files in dir: nil, nil when there is no token (missing or
// empty files), an *Error of KindMalformed when the files do not hold a valid grant.
func ReadDir(dir, lease string) (*Grant, error) {
	values := make(map[string]string, len(Files))
	for _, name := range Files {
		path := filepath.Join(dir, name)
		raw, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			raw = nil
		} else if err != nil {
			return nil, &Error{Kind: KindMalformed, Source: dir, Msg: err.Error(), Err: err}
		}
		for i, b := range raw {
			if b >= 0x80 { // the operator writes ASCII only
				return nil, malformed(dir, "%s: not ASCII text (byte %d)", path, i)
			}
		}
		values[name] = string(raw)
	}
	return Parse(values, lease, dir)
}

// Dir is the grant in a downward-API directory. Current reads the files on each call until
// Run is watching them; then it answers from the last read, which Run refreshes on every
// change (fsnotify) and at least every poll interval (a directory replaced wholesale or a
// missed event is still seen). Whether the grant is held is decided at each call.
type Dir struct {
	path  string
	lease string
	poll  time.Duration
	now   func() time.Time

	mu       sync.Mutex
	watching bool
	last     *Grant
	lastErr  error
	subs     map[chan struct{}]struct{}
}

// DirOption configures a Dir.
type DirOption func(*Dir)

// WithLease names the FencedLease (the files do not carry it; it shows in messages).
func WithLease(name string) DirOption { return func(d *Dir) { d.lease = name } }

// WithPollInterval bounds how long a missed change can go unseen while watching (default 1s).
func WithPollInterval(every time.Duration) DirOption { return func(d *Dir) { d.poll = every } }

// WithClock replaces time.Now (tests).
func WithClock(now func() time.Time) DirOption { return func(d *Dir) { d.now = now } }

// NewDir watches the downward-API directory path (DefaultDir when empty).
func NewDir(path string, opts ...DirOption) *Dir {
	if path == "" {
		path = DefaultDir
	}
	d := &Dir{path: path, poll: time.Second, now: time.Now, subs: map[chan struct{}]struct{}{}}
	for _, opt := range opts {
		opt(d)
	}
	if d.poll <= 0 {
		d.poll = time.Second
	}
	return d
}

// Describe names the directory.
func (d *Dir) Describe() string { return "directory " + d.path }

// Read reads the files now (nil, nil when nothing is granted).
func (d *Dir) Read() (*Grant, error) { return ReadDir(d.path, d.lease) }

// Current is the grant held now, or an *Error saying why there is none.
func (d *Dir) Current() (Grant, error) {
	d.mu.Lock()
	watching, last, lastErr := d.watching, d.last, d.lastErr
	d.mu.Unlock()
	if !watching {
		last, lastErr = d.Read()
	}
	return require(last, lastErr, d.Describe(), d.now())
}

func require(g *Grant, err error, source string, now time.Time) (Grant, error) {
	if err != nil {
		return Grant{}, err
	}
	if g == nil {
		return Grant{}, &Error{Kind: KindAbsent, Source: source, Msg: source + ": nothing granted"}
	}
	return *g, g.Check(now, 0)
}

// Changed returns a channel that receives (without blocking Run) after each change Run sees,
// and a function to stop receiving.
func (d *Dir) Changed() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	d.mu.Lock()
	d.subs[ch] = struct{}{}
	d.mu.Unlock()
	return ch, func() {
		d.mu.Lock()
		delete(d.subs, ch)
		d.mu.Unlock()
	}
}

// refresh re-reads the files and notifies subscribers if the grant changed.
func (d *Dir) refresh() {
	g, err := d.Read()
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := !d.watching || !sameGrant(d.last, g) || errText(d.lastErr) != errText(err)
	d.watching, d.last, d.lastErr = true, g, err
	if !changed {
		return
	}
	for ch := range d.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func sameGrant(a, b *Grant) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Run watches the directory until ctx is done (fsnotify when it can, and a re-read every
// poll interval in any case), then returns nil. Current answers from the watch meanwhile.
func (d *Dir) Run(ctx context.Context) error {
	defer func() {
		d.mu.Lock()
		d.watching = false
		d.mu.Unlock()
	}()
	var events <-chan fsnotify.Event
	var errs <-chan error
	watcher, err := fsnotify.NewWatcher()
	if err == nil {
		defer watcher.Close()
		events, errs = watcher.Events, watcher.Errors
	}
	added := false
	ticker := time.NewTicker(d.poll)
	defer ticker.Stop()
	for {
		if watcher != nil && !added {
			// The kubelet swaps a "..data" symlink in this directory: events on the
			// directory see it. A directory that does not exist yet is polled. Watch
			// first, then read: a change in between is not missed.
			added = watcher.Add(d.path) == nil
		}
		d.refresh()
		select {
		case <-ctx.Done():
			return nil
		case <-events:
		case <-errs:
		case <-ticker.C:
		}
	}
}

// Wait blocks until src shows a held grant with at least minRemaining left, polling every
// interval, or until ctx is done (then it returns the last error).
func Wait(ctx context.Context, src Source, minRemaining, interval time.Duration) (Grant, error) {
	for {
		g, err := src.Current()
		if err == nil {
			if err = g.Check(time.Now(), minRemaining); err == nil {
				return g, nil
			}
		}
		select {
		case <-ctx.Done():
			return Grant{}, err
		case <-time.After(interval):
		}
	}
}

// Func adapts a function to a Source (tests, or a grant read elsewhere).
type Func func() (Grant, error)

// Current calls f.
func (f Func) Current() (Grant, error) { return f() }

// Describe names it.
func (f Func) Describe() string { return "grant function" }
