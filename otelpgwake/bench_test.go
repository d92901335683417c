package otelpgwake_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pgwake/pgwake/otelpgwake"
	"github.com/pgwake/pgwake/pgwaketest"
	"github.com/pgwake/pgwake/queue"
)

// hookCases are the three setups the benchmarks compare: no hooks, the
// hooks with OpenTelemetry's no-op provider, the hooks with a recording SDK
// provider (sampling everything, exporting nothing).
func hookCases() []struct {
	name  string
	hooks queue.Hooks
} {
	return []struct {
		name  string
		hooks queue.Hooks
	}{
		{"none", queue.Hooks{}},
		{"noop", otelpgwake.Hooks(otelpgwake.Config{TracerProvider: noop.NewTracerProvider()})},
		{"sdk", otelpgwake.Hooks(otelpgwake.Config{TracerProvider: sdktrace.NewTracerProvider()})},
	}
}

// BenchmarkEnqueue is one Enqueue per op against the test database, with
// each setup; compare the ns/op of noop and sdk with none of the same run.
func BenchmarkEnqueue(b *testing.B) {
	for _, hc := range hookCases() {
		b.Run(hc.name, func(b *testing.B) {
			c := pgwaketest.NewClient(b, pgwaketest.Pool(b), queue.Config{Hooks: hc.hooks})
			ctx := context.Background()
			job := queue.NewJob{Kind: "bench", Payload: map[string]int{"n": 1}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Enqueue(ctx, job); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHooks is the hooks alone, no database: what they add to each
// job (its enqueue, its claim in a batch of one, its attempt and the write
// of its outcome).
func BenchmarkHooks(b *testing.B) {
	for _, hc := range hookCases() {
		b.Run(hc.name, func(b *testing.B) {
			ctx := context.Background()
			jobs := []queue.NewJob{{Kind: "bench"}}
			j := &queue.Job{ID: 1, Kind: "bench", Queue: "default", Attempt: 1}
			claimed, began := []*queue.Job{j}, time.Now()
			b.ReportAllocs()
			for b.Loop() {
				if h := hc.hooks.BeforeEnqueue; h != nil {
					jobs[0].Metadata = nil
					if done := h(ctx, jobs); done != nil {
						done(nil)
					}
					j.Metadata = jobs[0].Metadata
				}
				if h := hc.hooks.Claimed; h != nil {
					h(ctx, claimed, began)
				}
				if h := hc.hooks.Work; h != nil {
					if _, done := h(ctx, j); done != nil {
						done(nil)
					}
				}
				if h := hc.hooks.Complete; h != nil {
					if done := h(ctx, j); done != nil {
						done(queue.StateSucceeded, nil)
					}
				}
			}
		})
	}
}

// BenchmarkJobPaired is one job's whole path (Enqueue, then WorkOne: its
// claim, handler and the write of its outcome) with each setup in the same
// op, on a schema each, in rotating order and timed apart, so a shared
// machine's drift falls on all three alike. It reports each setup's mean
// (none-ns, noop-ns, sdk-ns) and the ratios noop/none and sdk/none: what
// the four hooks add to a job, as a fraction of the job's own cost.
func BenchmarkJobPaired(b *testing.B) {
	cases := hookCases()
	clients := make([]*queue.Client, len(cases))
	for i, hc := range cases {
		clients[i] = pgwaketest.NewClient(b, pgwaketest.Pool(b), queue.Config{
			Hooks: hc.hooks,
			Handlers: map[string]queue.Handler{"bench": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
				return nil
			})},
		})
	}
	ctx := context.Background()
	job := queue.NewJob{Kind: "bench", Payload: map[string]int{"n": 1}}
	spent := make([]time.Duration, len(cases))
	n := 0
	for b.Loop() {
		for k := range cases {
			i := (n + k) % len(cases)
			t0 := time.Now()
			if _, err := clients[i].Enqueue(ctx, job); err != nil {
				b.Fatal(err)
			}
			if _, ok, err := clients[i].WorkOne(ctx); err != nil || !ok {
				b.Fatal(ok, err)
			}
			spent[i] += time.Since(t0)
		}
		n++
	}
	for i, hc := range cases {
		b.ReportMetric(float64(spent[i].Nanoseconds())/float64(n), hc.name+"-ns")
		if i > 0 {
			b.ReportMetric(spent[i].Seconds()/spent[0].Seconds(), hc.name+"/none")
		}
	}
}
