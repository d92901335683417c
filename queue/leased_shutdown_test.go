package queue_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// A leased claim commits on the server in the statement itself. Run's
// context cancelled while that statement ran made the dispatcher drop its
// answer: the job was left running under a lease no handler held, never
// ran, and waited for the lease to expire to be rescued as a failed
// attempt (with MaxAttempts 1: failed without ever running). A claim that
// was sent completes, and its jobs run as any running job does at shutdown.
func TestLeasedClaimInFlightAtShutdownIsNotLeftRunning(t *testing.T) {
	var ran atomic.Int32
	e := newEnv(t, queue.Config{
		Queues:          map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		LeasedKinds:     []string{"x"},
		ShutdownTimeout: time.Minute,
		Handlers: map[string]queue.Handler{"x": queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, _ *queue.Job) error {
			ran.Add(1)
			return nil
		})},
	})
	ctx := context.Background()
	// The claim's UPDATE sleeps on the server, and a cancel request does
	// not stop it: Run's context is cancelled while the statement runs, as
	// when the cancel arrives just after the server ran it (seen without
	// the trigger in about one shutdown in three under a backlog), and the
	// server commits it afterwards.
	_, err := e.pool.Exec(ctx, `CREATE FUNCTION `+e.table("slow_claim")+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF OLD.state = 'pending' AND NEW.state = 'running' THEN
			BEGIN PERFORM pg_sleep(1); EXCEPTION WHEN query_canceled THEN PERFORM pg_sleep(0.5); END;
		END IF; RETURN NEW; END $$;
		CREATE TRIGGER slow_claim BEFORE UPDATE ON `+e.table("jobs")+` FOR EACH ROW EXECUTE FUNCTION `+e.table("slow_claim")+`()`)
	require.NoError(t, err)
	signals := queue.EnableTestSignals(e.c)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.c.Run(runCtx) }()
	signals.WaitAsleep(t, "default", 0) // past the start's warm-up, which runs the claim too
	r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "x", MaxAttempts: 1})
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the claim to sleep on the server", func() bool {
		return e.countSQL(`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE '%`+e.schema+`%'`) > 0
	})
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	// The claim's transaction has ended, committed or not.
	waitFor(t, 10*time.Second, "the claim to end", func() bool {
		return e.countSQL(`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE '%`+e.schema+`%'`) == 0
	})
	time.Sleep(100 * time.Millisecond)
	var state string
	var attempts int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT state, attempts FROM `+e.table("jobs")+` WHERE id = $1`, r.ID).Scan(&state, &attempts))
	switch state {
	case "succeeded":
		require.Equal(t, int32(1), ran.Load())
		require.Equal(t, 1, attempts)
	case "pending":
		require.Equal(t, int32(0), ran.Load())
		require.Equal(t, 0, attempts)
	default:
		t.Fatalf("job %s with %d attempts after a graceful shutdown; its handler ran %d times", state, attempts, ran.Load())
	}
}
