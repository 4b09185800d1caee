package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/fencedlease/fencedlease/go/fenced"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestAPIWriteCost times a controller's write through the real API server, run by
// bench/go_client.py (make bench): the plain client's Update of an unlabelled ConfigMap
// against the fenced client's Update of a labelled one (the token read and stamped, the fence
// webhook called). The rows are interleaved in a shuffled order each round, so machine load
// hits both alike; prints one JSON line of the per-write latencies in microseconds.
func TestAPIWriteCost(t *testing.T) {
	ctx, cfg, ns, src := setup(t, "bench")
	n, err := strconv.Atoi(os.Getenv("FENCEDLEASE_GO_IT_WRITES"))
	if err != nil || n <= 0 {
		n = 300
	}
	cfg.QPS = -1 // no client-side rate limit (client-go's default is 5/s): time the writes
	base, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := fenced.Wrap(base, src)
	plain := configMap(ns, "bench-plain", "go")
	plain.Labels = nil
	fencedCM := configMap(ns, "bench-fenced", "go")
	if err := base.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, fencedCM); err != nil {
		t.Fatal(err)
	}
	rows := map[string]func(i int) error{
		"plain": func(i int) error {
			plain.Data["i"] = strconv.Itoa(i)
			return base.Update(ctx, plain)
		},
		"fenced": func(i int) error {
			fencedCM.Data["i"] = strconv.Itoa(i)
			return c.Update(ctx, fencedCM)
		},
	}
	names := []string{"plain", "fenced"}
	times := map[string][]float64{}
	for i := -20; i < n; i++ { // 20 rounds of warm-up (connections, caches)
		rand.Shuffle(len(names), func(a, b int) { names[a], names[b] = names[b], names[a] })
		for _, name := range names {
			start := time.Now()
			if err := rows[name](i); err != nil {
				t.Fatalf("%s write %d: %v", name, i, err)
			}
			if i >= 0 {
				times[name] = append(times[name], float64(time.Since(start).Microseconds()))
			}
		}
	}
	if got := fencedCM.Annotations[fenced.TokenAnnotation]; got == "" {
		t.Fatal("the fenced writes carried no token")
	}
	out := map[string]map[string]float64{}
	for name, values := range times {
		sort.Float64s(values)
		out[name] = map[string]float64{"n": float64(len(values)), "p50": pct(values, 0.5), "p99": pct(values, 0.99)}
	}
	line, _ := json.Marshal(out)
	fmt.Printf("GO-API-BENCH %s\n", line)
}

func pct(sorted []float64, q float64) float64 {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
