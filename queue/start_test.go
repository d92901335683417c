package queue_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// Start returns once the workers listen, Stop ends them with its context as
// the deadline for running handlers (whose cancelled attempts are recorded);
// misuse gets typed errors.
func TestStartAndStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var cancelled atomic.Bool
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: time.Hour, // only a wake-up can start the job soon
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			// The first job's first attempt runs until Stop's deadline; the
			// job that wakes the worker later does not (it held the last
			// Stop until its one-minute job timeout).
			if j.Attempt == 1 && !cancelled.Load() {
				<-ctx.Done() // runs until Stop's deadline
				cancelled.Store(true)
				return context.Cause(ctx)
			}
			return nil
		})},
	})
	require.ErrorIs(t, e.c.Stop(ctx), queue.ErrNotStarted)
	require.NoError(t, e.c.Start(ctx))
	require.ErrorIs(t, e.c.Start(ctx), queue.ErrAlreadyRunning)
	require.ErrorIs(t, e.c.Run(ctx), queue.ErrAlreadyRunning)
	res, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	// Start returned after the listener was up: the job is woken, not polled.
	waitFor(t, 10*time.Second, "job running", func() bool {
		return e.countSQL(`SELECT count(*) FROM `+e.table("attempts")+` WHERE job_id = $1`, res.ID) == 1
	})
	stopCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	require.NoError(t, e.c.Stop(stopCtx))
	require.GreaterOrEqual(t, time.Since(t0), 250*time.Millisecond)
	require.True(t, cancelled.Load(), "the running handler was cancelled at Stop's deadline")
	require.Equal(t, 1, e.count(`id = $1 AND state = 'pending' AND attempts = 1`, res.ID), "the cancelled attempt counted")
	require.ErrorIs(t, e.c.Stop(ctx), queue.ErrNotStarted)
	// Startable again after Stop.
	require.NoError(t, e.c.Start(ctx))
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET run_after = now() WHERE id = $1`, res.ID)
	require.NoError(t, err)
	_, err = e.c.Enqueue(ctx, queue.NewJob{Kind: "k"}) // wakes the worker
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "retry done", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, res.ID) == 1 })
	require.NoError(t, e.c.Stop(ctx))
}

// Start and Run refuse a schema that lacks migrations, and Start a listener
// that cannot connect, before any worker starts.
func TestStartupErrorsAreReturned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	cfg := queue.Config{
		Schema:   pgtest.SchemaOn(t, pool), // never migrated
		Queues:   map[string]queue.QueueConfig{"default": {}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })},
	}
	c, err := queue.New(pool, cfg)
	require.NoError(t, err)
	err = c.Start(ctx)
	require.ErrorIs(t, err, queue.ErrSchemaNotMigrated)
	require.Contains(t, err.Error(), "pgwake migrate")
	require.ErrorIs(t, c.Run(ctx), queue.ErrSchemaNotMigrated)

	// Client.Migrate migrates the client's own schema; then it starts.
	applied, err := c.Migrate(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, applied)
	applied, err = c.Migrate(ctx)
	require.NoError(t, err)
	require.Empty(t, applied, "a second Migrate has nothing to apply")
	require.NoError(t, c.Start(ctx))
	require.NoError(t, c.Stop(ctx))

	e := newEnv(t, queue.Config{})
	cc := e.pool.Config().ConnConfig.Copy()
	cc.Port = 1        // nothing listens there
	cc.Fallbacks = nil // sslmode=prefer (a URL without sslmode) adds one on the real port
	cc.ConnectTimeout = 100 * time.Millisecond
	cfg.Schema, cfg.ListenerConnConfig = e.schema, cc
	c, err = queue.New(e.pool, cfg)
	require.NoError(t, err)
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	err = c.Start(sctx)
	require.Error(t, err)
	require.True(t, errors.Is(err, context.DeadlineExceeded), err)
	require.ErrorIs(t, c.Stop(ctx), queue.ErrNotStarted)
}

// A pool whose idle connections the server closed (a restart, a terminated
// backend) fails their first use: Start takes fresh ones and starts,
// instead of returning a transient error as a startup failure.
func TestStartSurvivesClosedPoolConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvOwnPool(t, 4, queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })},
	})
	// Four idle connections in the pool, then the server closes them.
	pids := openIdle(t, e.pool, 4)
	_, err := pgtest.Pool(t).Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid`, pids)
	require.NoError(t, err)
	pgtest.WaitFor(t, 10*time.Second, "the backends to end", func() bool {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])`, pids).Scan(&n))
		return n == 0
	})
	require.NoError(t, e.c.Start(ctx))
	require.NoError(t, e.c.Stop(ctx))
}

// Start opens the connections the held workers will hold (one per worker
// and one per queue), so the first jobs after a start do not wait while
// the pool opens them; it leaves one of the pool's free.
func TestStartOpensTheWorkersConnections(t *testing.T) {
	t.Parallel()
	e := newEnvOwnPool(t, 20, queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 4}, "other": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			return nil
		})},
	})
	// The warm-up is best effort within 500 ms; what it opens is what this
	// test checks, so a loaded machine must not cut it short (a CI run
	// opened 6 of 8 in time).
	queue.SetWarmPoolTimeout(e.c, 30*time.Second)
	ctx := context.Background()
	require.Less(t, e.pool.Stat().TotalConns(), int32(4), "the pool starts nearly empty")
	require.NoError(t, e.c.Start(ctx))
	defer func() { require.NoError(t, e.c.Stop(ctx)) }()
	// 4 + 1 and 2 + 1: the workers' and the claims' connections.
	require.GreaterOrEqual(t, e.pool.Stat().TotalConns(), int32(8))
}

// A client whose kinds are all leased holds no connection while handlers
// run: Start opens one per queue's claim, one for the grouped completions
// and one for the lease heartbeat, not one per worker, and readies the
// leased claim on each: prepared and past the plans PostgreSQL makes for a
// statement's first executions on a connection (custom_plans counts them).
// So the first jobs after a start wait for neither a connection nor a parse
// nor a plan.
func TestStartReadiesTheLeasedWorkersConnections(t *testing.T) {
	t.Parallel()
	e := leasedOnlyEnv(t)
	ctx := context.Background()
	require.Less(t, e.pool.Stat().TotalConns(), int32(3), "the pool starts nearly empty")
	require.NoError(t, e.c.Start(ctx))
	defer func() { require.NoError(t, e.c.Stop(ctx)) }()
	total := e.pool.Stat().TotalConns()
	require.GreaterOrEqual(t, total, int32(3))
	require.Less(t, total, int32(10), "not one per worker")
	// "AS started" is in the leased claim only.
	ready, idle := connsWithPrepared(t, e, `statement LIKE '%AS started%' AND custom_plans >= 5`)
	t.Logf("%d connections, %d idle, %d with the claim ready", total, idle, len(ready))
	require.GreaterOrEqual(t, len(ready), 3)
}

// connsWithPrepared waits until every connection of e's pool is idle (the
// loops' first looks, the completer's and the heartbeat's borrow some right
// after Start) and returns the backend pids of those with a prepared
// statement matching cond (a condition on pg_prepared_statements), and how
// many connections it read.
func connsWithPrepared(t *testing.T, e *env, cond string) (pids []uint32, read int) {
	t.Helper()
	ctx := context.Background()
	var conns []*pgxpool.Conn
	waitFor(t, 10*time.Second, "every connection idle", func() bool {
		for _, c := range conns {
			c.Release()
		}
		conns = e.pool.AcquireAllIdle(ctx)
		return int32(len(conns)) == e.pool.Stat().TotalConns()
	})
	for _, c := range conns {
		var n int
		// This query is a prepared statement too: leave it out.
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_prepared_statements
			WHERE statement NOT LIKE '%pg_prepared_statements%' AND `+cond).Scan(&n))
		if n > 0 {
			pids = append(pids, c.Conn().PgConn().PID())
		}
		c.Release()
	}
	return pids, len(conns)
}

// The claims Start runs to ready a leased client's connections are rolled
// back: a pending job (of a paused queue, so the workers leave it alone)
// is neither started nor counted, and has no started event.
func TestStartReadiesTheClaimWithoutStartingAJob(t *testing.T) {
	t.Parallel()
	e := leasedOnlyEnv(t)
	ctx := context.Background()
	r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	require.NoError(t, e.c.PauseQueue(ctx, "default"))
	require.NoError(t, e.c.Start(ctx))
	require.NoError(t, e.c.Stop(ctx))
	require.Equal(t, 1, e.count(`id = $1 AND state = 'pending' AND attempts = 0 AND leased_by IS NULL`, r.ID))
	require.Equal(t, 0, e.countSQL(`SELECT count(*) FROM `+e.table("events")+` WHERE job_id = $1 AND type = 'started'`, r.ID))
}

// leasedOnlyEnv is a client whose only kind, "k", is leased (10 workers, a
// no-op handler), on a pool of its own of 20 connections, whose warm-up at
// Start is not cut short.
func leasedOnlyEnv(t *testing.T) *env {
	t.Helper()
	e := newEnvOwnPool(t, 20, queue.Config{
		Queues:         map[string]queue.QueueConfig{"default": {MaxWorkers: 10}},
		LeasedKinds:    []string{"k"},
		AllowSmallPool: true,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			return nil
		})},
	})
	// The warm-up is best effort within 500 ms: what it readies is what
	// these tests check, so a loaded machine must not cut it short (a CI
	// run readied 2 of 3 connections in time).
	queue.SetWarmPoolTimeout(e.c, 30*time.Second)
	return e
}

// Start readies each of a leased client's connections in one round trip:
// the claims, the idle mark and barrier and the grouped completion are sent
// in one batch between BEGIN and ROLLBACK, not one statement at a time, so
// a 2-core machine busy opening connections does not wait a round trip per
// statement before the first claim.
func TestStartReadiesALeasedConnectionInOneRoundTrip(t *testing.T) {
	t.Parallel()
	rec := &batchRecorder{cur: map[*pgx.Conn][]string{}}
	e := newEnvWithPool(t, pgtest.NewPool(t, func(c *pgxpool.Config) {
		c.MaxConns = 20
		c.ConnConfig.Tracer = rec
	}), queue.Config{
		Queues:         map[string]queue.QueueConfig{"default": {MaxWorkers: 10}},
		LeasedKinds:    []string{"k"},
		AllowSmallPool: true,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			return nil
		})},
	})
	ctx := context.Background()
	// The warm-up is best effort within 500 ms: under a loaded CI run it
	// readied none in time.
	queue.SetWarmPoolTimeout(e.c, 30*time.Second)
	require.NoError(t, e.c.Start(ctx))
	require.NoError(t, e.c.Stop(ctx))
	readied := 0
	rec.mu.Lock()
	for _, b := range rec.batches {
		claims := 0
		for _, sql := range b {
			if strings.Contains(sql, "AS started") {
				claims++
			}
		}
		if claims >= 5 && b[0] == "BEGIN" && b[len(b)-1] == "ROLLBACK" {
			readied++
		}
	}
	rec.mu.Unlock()
	require.GreaterOrEqual(t, readied, 3, "connections readied in one batch each")
}

// Start's warm-up gives up after its deadline between connections, never
// during one: a statement cut short closes its connection (pgx), and the
// workers would then wait for the pool to open it again. Here every
// connection's claim statements wait for a lock that outlasts the warm-up's
// deadline; the warm-up waits for them, and every connection the pool had
// before Start is still open after it, with the claim prepared.
func TestStartCutShortKeepsItsConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvOwnPool(t, 12, queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })},
	})
	queue.SetWarmPoolTimeout(e.c, warmDeadline)
	// The connections the held workers want (4 + 1), open and idle.
	pids := openIdle(t, e.pool, 5)
	defer lockJobsPastWarmUp(t, e, pids, 4)()

	require.NoError(t, e.c.Start(ctx))
	defer func() { require.NoError(t, e.c.Stop(ctx)) }()
	var alive int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])`, pids).Scan(&alive))
	require.Equal(t, len(pids), alive, "the connections the warm-up readied are still open")
	// "SKIP LOCKED" is in the held claims. The warm-up began four
	// connections (warmParallel) before its deadline, and their statements
	// ran to the end.
	ready, _ := connsWithPrepared(t, e, heldClaimPrepared)
	began := 0
	for _, pid := range pids {
		if slices.Contains(ready, pid) {
			began++
		}
	}
	require.GreaterOrEqual(t, began, 4, "connections open before Start with the claim prepared")
}

// openIdle opens n connections in pool, leaves them idle and returns their
// backend pids.
func openIdle(t *testing.T, pool *pgxpool.Pool, n int) []uint32 {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	pids := make([]uint32, n)
	for i := range conns {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		conns[i], pids[i] = c, c.Conn().PgConn().PID()
	}
	for _, c := range conns {
		c.Release()
	}
	return pids
}

// warmDeadline is the warm-up's deadline in the tests that hold its
// statements on a lock: long enough for a loaded machine (CI runs every
// package at once, under -race) to begin four connections in it; at 100 ms
// one began now and then.
const warmDeadline = time.Second

// lockJobsPastWarmUp locks e's jobs table (ACCESS EXCLUSIVE: every
// statement on it waits) from another pool, and looks at pids (every 10 ms)
// for backends waiting on a lock. It unlocks once n of them were seen
// waiting at once and warmDeadline (and a margin) has passed since the
// first was: the warm-up's deadline began before its first statement, so
// it has passed when the lock ends, and the warm-up begins nothing after.
// It unlocks after 20 s in any case, and the test's cleanup waits for it.
// The returned func waits until it is unlocked and returns the most
// backends seen waiting at once.
func lockJobsPastWarmUp(t *testing.T, e *env, pids []uint32, n int32) (wait func() int32) {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	if _, err = lock.Exec(ctx, `LOCK TABLE `+e.table("jobs")+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		_ = lock.Rollback(ctx)
		require.NoError(t, err)
	}
	var most int32
	unlocked := make(chan struct{})
	t.Cleanup(func() { <-unlocked })
	go func() {
		defer close(unlocked)
		defer func() { _ = lock.Rollback(context.Background()) }()
		giveUp := time.Now().Add(20 * time.Second)
		var first time.Time
		for time.Now().Before(giveUp) {
			var w int32
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE pid = ANY($1::int[]) AND wait_event_type = 'Lock'`, pids).Scan(&w); err == nil {
				if w > 0 && first.IsZero() {
					first = time.Now()
				}
				most = max(most, w)
			}
			if most >= n && time.Since(first) > warmDeadline+300*time.Millisecond {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return func() int32 { <-unlocked; return most }
}

// Start's warm-up readies at most four connections at a time and begins
// none after its deadline. Here every connection's claim statements wait
// for a lock that outlasts the warm-up's deadline: four wait at once, never
// more, and the two of the six it had not begun by then are left alone.
// The queue is paused, so the workers prepare nothing themselves.
func TestStartWarmsFourConnectionsAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvOwnPool(t, 12, queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {MaxWorkers: 5}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })},
	})
	require.NoError(t, e.c.PauseQueue(ctx, "default"))
	queue.SetWarmPoolTimeout(e.c, warmDeadline)
	pids := openIdle(t, e.pool, 6) // the connections the held workers want (5 + 1)
	unlocked := lockJobsPastWarmUp(t, e, pids, 4)
	require.NoError(t, e.c.Start(ctx))
	defer func() { require.NoError(t, e.c.Stop(ctx)) }()
	require.Equal(t, int32(4), unlocked(), "connections waiting at once")
	ready, _ := connsWithPrepared(t, e, heldClaimPrepared)
	require.Len(t, ready, 4, "connections the warm-up readied")
}

// Start readies the connections it opens, also one its deadline
// interrupted while it opened: left to the pool unready, that one is the
// first the pool hands out (the most recently returned), and the first job
// after a start parsed and planned the claim on it (9-14 ms from commit to
// handler on a 2-core machine, against 1-3 ms). Here each new connection
// takes 400 ms to open, four times the warm-up's deadline, and the queue
// is paused, so the workers prepare nothing themselves.
func TestStartReadiesTheConnectionsItOpens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvWithPool(t, pgtest.NewPool(t, func(c *pgxpool.Config) {
		c.MaxConns = 20
		c.AfterConnect = func(context.Context, *pgx.Conn) error {
			time.Sleep(400 * time.Millisecond)
			return nil
		}
	}), queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })},
	})
	require.NoError(t, e.c.PauseQueue(ctx, "default")) // opens one connection
	queue.SetWarmPoolTimeout(e.c, 100*time.Millisecond)
	require.NoError(t, e.c.Start(ctx))
	defer func() { require.NoError(t, e.c.Stop(ctx)) }()
	// "SKIP LOCKED" is in the held claims.
	ready, conns := connsWithPrepared(t, e, heldClaimPrepared)
	require.GreaterOrEqual(t, conns, 2, "connections: the one before Start and those it began")
	require.Len(t, ready, conns, "connections with the claim prepared")
}

// A handler that calls Stop (a "shut down" job, a fatal configuration
// error) waited for ever before: Stop waits for the running handlers, the
// caller among them. Now Stop returns ErrStopInHandler at once, the client
// stops claiming, and it stops once the handler returned: the job itself
// succeeds, and a job enqueued after it is not run.
func TestStopFromAHandler(t *testing.T) {
	t.Parallel()
	stopped := make(chan error, 1)
	var c *queue.Client
	e := newEnv(t, queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{
			"stop": queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, _ *queue.Job) error {
				stopped <- c.Stop(ctx)
				return nil
			}),
			"x": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil }),
		},
	})
	c = e.c
	ctx := context.Background()
	require.NoError(t, c.Start(ctx))
	r, err := c.Enqueue(ctx, queue.NewJob{Kind: "stop"})
	require.NoError(t, err)
	select {
	case err := <-stopped:
		require.ErrorIs(t, err, queue.ErrStopInHandler)
	case <-time.After(30 * time.Second):
		t.Fatal("Stop called from a handler did not return")
	}
	waitFor(t, 10*time.Second, "the stop job to succeed", func() bool {
		return e.count(`id = $1 AND state = 'succeeded'`, r.ID) == 1
	})
	require.ErrorIs(t, c.Stop(ctx), queue.ErrNotStarted)
	// Stopped: a job enqueued now stays pending.
	r2, err := c.Enqueue(ctx, queue.NewJob{Kind: "x"})
	require.NoError(t, err)
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, 1, e.count(`id = $1 AND state = 'pending'`, r2.ID))
}

// heldClaimPrepared selects the held claims among a connection's prepared
// statements: "SKIP LOCKED" is in them, and in the rescue of expired leases,
// which a client without leased kinds runs at its start.
const heldClaimPrepared = `statement LIKE '%SKIP LOCKED%' AND statement NOT LIKE '%lease_expires_at < clock_timestamp()%'`
