//go:build soak

package reliability

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// envDuration reads a duration from the environment.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "%s=%q", name, v)
	return d
}

// rssBytes is the process's resident set size from /proc (0 elsewhere).
func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

type sample struct {
	at         time.Duration
	heap, rss  uint64
	goroutines int
	done       int
}

// TestSoak runs steady load (PGWAKE_SOAK_RATE jobs/s, default 200) through
// three in-process worker clients for PGWAKE_SOAK_DURATION (default 1h),
// sampling heap (after a GC), RSS and goroutines every PGWAKE_SOAK_SAMPLE
// (default 1m). It fails if the last sample's goroutines exceed the first
// steady sample's by more than 20, or its heap or RSS are more than twice
// the first steady sample's plus 32 MiB; then it checks the usual
// invariants over every job. Run: make soak.
func TestSoak(t *testing.T) {
	dur := envDuration(t, "PGWAKE_SOAK_DURATION", time.Hour)
	every := envDuration(t, "PGWAKE_SOAK_SAMPLE", time.Minute)
	rate := 200.0
	if v := os.Getenv("PGWAKE_SOAK_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		require.NoError(t, err)
		rate = r
	}
	n := int(rate * dur.Seconds())
	w := newWorld(t, false)
	for range 3 {
		w.startWorker(w.url, 2*time.Second, time.Millisecond)
	}
	start := time.Now()
	prod := w.produce(w.url, n, 2, rate)
	take := func() sample {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return sample{at: time.Since(start), heap: ms.HeapAlloc, rss: rssBytes(), goroutines: runtime.NumGoroutine(), done: w.finalJobs()}
	}
	var samples []sample
	tick := time.NewTicker(every)
	defer tick.Stop()
loop:
	for {
		select {
		case <-prod.done:
			break loop
		case <-tick.C:
			s := take()
			samples = append(samples, s)
			t.Logf("SAMPLE t=%s heap=%.1fMiB rss=%.1fMiB goroutines=%d jobs_done=%d",
				s.at.Round(time.Second), float64(s.heap)/(1<<20), float64(s.rss)/(1<<20), s.goroutines, s.done)
		}
	}
	prod.wait(time.Minute)
	// Keep PGWAKE_SOAK_RATE below what the machine sustains: a backlog
	// must drain before the check.
	w.waitAllFinal(n, 30*time.Minute)
	w.check(t.Name(), n, true, 0, prod, fmt.Sprintf("duration=%s rate=%.0f/s samples=%d", dur, rate, len(samples)))

	require.GreaterOrEqual(t, len(samples), 3, "too few samples to judge growth; run longer or sample more often")
	base, last := samples[1], samples[len(samples)-1] // samples[0] may still be warming up
	require.LessOrEqual(t, last.goroutines, base.goroutines+20, "goroutines grew")
	require.LessOrEqual(t, last.heap, 2*base.heap+32<<20, "heap grew")
	require.LessOrEqual(t, last.rss, 2*base.rss+32<<20, "RSS grew")
}
