package otelpgwake_test

import (
	"context"
	"testing"
	"time"

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
