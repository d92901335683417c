package queue_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// stepLog records, in order, the claims a pool sends (any round trip with a
// statement that locks jobs) and the handlers' starts.
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
// just when the job's latency is paid. The wait is bounded (2 ms); the test
// lifts the bound so that the order does not depend on the machine's speed.
func TestWakeUpClaimWaitsForItsHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := &stepLog{}
	pool := pgtest.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = log })
	e := newEnvWithPool(t, pool, queue.Config{
		PollInterval: time.Hour,
		Queues:       map[string]queue.QueueConfig{"q": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			log.add("handler")
			return nil
		})},
	})
	queue.SetHandOff(e.c, time.Minute)
	sig := queue.EnableTestSignals(e.c)
	defer e.run()()
	sig.WaitAsleep(t, "q", 0)
	for i := range 5 {
		log.take()
		_, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "q", Kind: "k"})
		require.NoError(t, err)
		sig.WaitAsleep(t, "q", i+1)
		steps := log.take()
		require.GreaterOrEqual(t, len(steps), 3, "%v", steps)
		// The wake-up's claim, its job's handler, then the next look.
		require.Equal(t, []string{"claim", "handler", "claim"}, steps[:3], "job %d", i+1)
	}
}
