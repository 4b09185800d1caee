package fenced

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fencedlease/fencedlease/go/grant"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// nothing is an API server that answers every write at once: what remains is the wrapper.
// A Patch is computed (patch.Data) as the real client would before sending it.
func nothing() client.WithWatch {
	ok := func(context.Context, client.WithWatch, client.Object, ...client.UpdateOption) error { return nil }
	patched := func(_ context.Context, _ client.WithWatch, obj client.Object, patch client.Patch, _ ...client.PatchOption) error {
		_, err := patch.Data(obj)
		return err
	}
	return interceptor.NewClient(fake.NewClientBuilder().Build(), interceptor.Funcs{Update: ok, Patch: patched})
}

func benchDir(b *testing.B) string {
	dir := b.TempDir()
	files := map[string]string{
		grant.FileToken: "752\n", grant.FileLeaseID: "5f3a9c0d12ab",
		grant.FileValidUntil: time.Now().Add(time.Hour).UTC().Format(time.RFC3339), grant.FileState: "held",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

func benchUpdate(b *testing.B, src grant.Source, wrap bool) {
	var c client.Client = nothing()
	if wrap {
		c = Wrap(c, src)
	}
	obj := cm("x", true)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Update(ctx, obj); err != nil {
			b.Fatal(err)
		}
	}
}

// The wrapper's own cost per write, the grant read included: a watched directory (read from
// memory, as leadership.Wrap runs it) and one read from the files on every write.
func BenchmarkUpdatePlain(b *testing.B) { benchUpdate(b, nil, false) }

func BenchmarkUpdateFencedWatchedDir(b *testing.B) {
	src := grant.NewDir(benchDir(b), grant.WithPollInterval(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed, stop := src.Changed()
	defer stop()
	go func() { _ = src.Run(ctx) }()
	<-changed
	benchUpdate(b, src, true)
}

func BenchmarkUpdateFencedReadEachWrite(b *testing.B) {
	benchUpdate(b, grant.NewDir(benchDir(b)), true)
}

// A merge patch (client.MergeFrom, as a reconciler writes) through the fenced client: the
// token read from a watched directory and stamped into the patch, against the plain client.
func benchPatch(b *testing.B, src grant.Source, wrap bool) {
	var c client.Client = nothing()
	if wrap {
		c = Wrap(c, src)
	}
	before := cm("x", true)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		obj := before.DeepCopy()
		obj.Data["k"] = "w"
		if err := c.Patch(ctx, obj, client.MergeFrom(before)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPatchPlain(b *testing.B) { benchPatch(b, nil, false) }

func BenchmarkPatchFencedWatchedDir(b *testing.B) {
	src := grant.NewDir(benchDir(b), grant.WithPollInterval(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed, stop := src.Changed()
	defer stop()
	go func() { _ = src.Run(ctx) }()
	<-changed
	benchPatch(b, src, true)
}

func BenchmarkStampMergePatch(b *testing.B) {
	body := []byte(`{"data":{"owner":"b"},"metadata":{"resourceVersion":"7"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := stampBody(body, "application/merge-patch+json", "752"); err != nil {
			b.Fatal(err)
		}
	}
}

// The same two Patches alternated in blocks, timed in wall-clock and in this process's CPU
// time (getrusage: the GC's work included, other processes' load not): the wrapper's own cost
// per merge patch (token read, stamp) is the difference. On a shared machine the CPU figure is
// the steadier one.
func BenchmarkPatchFencedMinusPlain(b *testing.B) {
	src := grant.NewDir(benchDir(b), grant.WithPollInterval(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed, stop := src.Changed()
	defer stop()
	go func() { _ = src.Run(ctx) }()
	<-changed
	clients := [2]client.Client{nothing(), Wrap(nothing(), src)}
	var wall, cpu [2]time.Duration
	var count [2]int
	before := cm("x", true)
	const block = 200
	i := 0
	for b.Loop() {
		which := (i / block) % 2
		if i%block == 0 {
			if i > 0 {
				prev := 1 - which
				wall[prev] += time.Since(blockStart)
				cpu[prev] += cpuTime() - blockCPU
			}
			blockStart, blockCPU = time.Now(), cpuTime()
		}
		obj := before.DeepCopy()
		obj.Data["k"] = "w"
		if err := clients[which].Patch(ctx, obj, client.MergeFrom(before)); err != nil {
			b.Fatal(err)
		}
		count[which]++
		i++
	}
	if count[0] < block || count[1] < block {
		return // too few iterations to compare (b.Loop's first calibration rounds)
	}
	per := func(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / float64(n) }
	done := [2]int{count[0] - count[0]%block, count[1] - count[1]%block} // whole blocks timed
	if (i/block)%2 == 1 {
		done[0] = count[0]
	}
	b.ReportMetric(per(cpu[1], done[1])-per(cpu[0], done[0]), "wrapper-cpu-ns/patch")
	b.ReportMetric(per(wall[1], done[1])-per(wall[0], done[0]), "wrapper-wall-ns/patch")
	b.ReportMetric(per(cpu[0], done[0]), "plain-cpu-ns/patch")
}

var (
	blockStart time.Time
	blockCPU   time.Duration
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
