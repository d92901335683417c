package queue_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// stepLog records, in order, the claims a pool sends (any round trip with a
// statement that locks jobs) and the handlers' starts (as the executor is
// about to call the handler: the handler's own first line would race with
// the dispatcher's next claim once the dispatcher is told).
type stepLog struct {
	mu    sync.Mutex
	steps []string
}

func (s *stepLog) add(step string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = append(s.steps, step)
}

func (s *stepLog) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.steps
	s.steps = nil
	return out
}

func (s *stepLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if strings.Contains(q.SQL, "SKIP LOCKED") {
			s.add("claim")
			break
		}
	}
	return ctx
}
func (s *stepLog) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *stepLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (s *stepLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "SKIP LOCKED") {
		s.add("claim")
	}
	return ctx
}
func (s *stepLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// After a wake-up claims a single job on a quiet queue, the loop's next look
// (a claim) waits until that job's handler has started: sent at once, it
// competes with the executor's attempt record and the handler for the CPU
// just when the job's latency is paid. The same holds for a leased job,
// whose claim started it. The wait is bounded (2 ms); the test lifts the
// bound so that the order does not depend on the machine's speed.
func TestWakeUpClaimWaitsForItsHandler(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"held", "leased"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			log := &stepLog{}
			var ran atomic.Int64
			pool := pgtest.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = log })
			cfg := queue.Config{
				PollInterval: time.Hour,
				Queues:       map[string]queue.QueueConfig{"q": {MaxWorkers: 2}},
				Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
					ran.Add(1)
					return nil
				})},
			}
			if mode == "leased" {
				// With a held kind too: a client whose kinds are all leased
				// sleeps after a wake-up's claim that took every due job,
				// with no next look to wait.
				cfg.LeasedKinds = []string{"k"}
				cfg.Handlers["h"] = queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })
			}
			e := newEnvWithPool(t, pool, cfg)
			queue.SetHandOff(e.c, time.Minute)
			sig := queue.EnableTestSignals(e.c)
			sig.HandlerStarts(func(int64) { log.add("handler") })
			defer e.run()()
			sig.WaitAsleep(t, "q", 0)
			for i := range 5 {
				log.take()
				_, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "q", Kind: "k"})
				require.NoError(t, err)
				sig.WaitAsleep(t, "q", i+1)
				steps := log.take()
				require.GreaterOrEqual(t, len(steps), 3, "job %d: %v", i+1, steps)
				// The wake-up's claim, its job's handler, then the next look.
				require.Equal(t, []string{"claim", "handler", "claim"}, steps[:3], "job %d", i+1)
			}
			waitFor(t, 10*time.Second, "every handler ran", func() bool { return ran.Load() == 5 })
		})
	}
}

// The wait is bounded: a handler that has not started (here a leased one,
// held before its lease is registered) does not keep the dispatcher from
// its next look beyond handOff (2 ms).
func TestWakeUpClaimWaitIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := &stepLog{}
	pool := pgtest.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = log })
	noop := queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })
	e := newEnvWithPool(t, pool, queue.Config{
		PollInterval: time.Hour,
		Queues:       map[string]queue.QueueConfig{"q": {MaxWorkers: 2}},
		LeasedKinds:  []string{"k"},
		Handlers:     map[string]queue.Handler{"k": noop, "h": noop}, // "h" held: the client looks again
	})
	sig := queue.EnableTestSignals(e.c)
	release := make(chan struct{})
	sig.BeforeLease(func(int64) { <-release })
	defer e.run()()
	defer close(release)
	sig.WaitAsleep(t, "q", 0)
	log.take()
	_, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "q", Kind: "k"})
	require.NoError(t, err)
	// The wake-up's claim and the next look, while the handler cannot start.
	sig.WaitAsleep(t, "q", 1)
	steps := log.take()
	require.GreaterOrEqual(t, len(steps), 2, "%v", steps)
	require.Equal(t, []string{"claim", "claim"}, steps[:2])
}
