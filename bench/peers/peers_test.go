package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/pgwake/pgwake/bench/harness"
)

// TestPeersExactlyOnce runs River and watermill-sql through every mode they
// support at tiny sizes, on a throwaway cluster (or $PGWAKE_DATABASE_URL),
// and requires each job handled exactly once.
func TestPeersExactlyOnce(t *testing.T) {
	var out, log bytes.Buffer
	results, err := harness.Run(context.Background(), harness.Options{
		DatabaseURL: os.Getenv("PGWAKE_DATABASE_URL"),
		Modes:       []harness.Mode{harness.ModeDrain, harness.ModeLatency, harness.ModeIdle, harness.ModeDelayed, harness.ModeEnqueue},
		Sizes: harness.Sizes{
			DrainJobs: 300, Rate: 100, LatencyDuration: time.Second,
			IdleInterval: 100 * time.Millisecond, IdleDuration: 500 * time.Millisecond,
			DelayedJobs: 20, DelayedSpread: time.Second, Producers: 4, EnqueueDuration: time.Second,
			IdleTimeout: 30 * time.Second,
		},
		Workers: 4,
		Out:     &out,
		Log:     &log,
		Commit:  "test",
	}, newSystem("pgwake", 0), newSystem("river-tuned", 0), newSystem("watermill-tuned", 0))
	if err != nil {
		t.Fatalf("%v\nlog:\n%s", err, log.String())
	}
	want := map[string]int{"pgwake": 5, "river-tuned": 5, "watermill-tuned": 3}
	got := map[string]int{}
	for _, r := range results {
		got[r.System]++
		if r.Duplicates != 0 || r.Missing != 0 {
			t.Errorf("%s %s: %d duplicates, %d missing", r.System, r.Mode, r.Duplicates, r.Missing)
		}
		if !(r.JobsPerSec > 0) {
			t.Errorf("%s %s: jobs/s %v", r.System, r.Mode, r.JobsPerSec)
		}
	}
	for s, n := range want {
		if got[s] != n {
			t.Errorf("%s: %d results, want %d", s, got[s], n)
		}
	}
	if !bytes.Contains(out.Bytes(), []byte("ratios pgwake / peer")) {
		t.Errorf("no ratios in the report:\n%s", out.String())
	}
}
