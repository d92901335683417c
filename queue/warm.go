package queue

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// warmPoolTimeout bounds warmPool.
const warmPoolTimeout = 500 * time.Millisecond

// warmParallel bounds how many connections warmPool opens or readies at
// once. Dozens at once take longer on a small machine than the warm-up may:
// on 2 cores a client with 50 held workers opened 50 connections together,
// none was ready within warmPoolTimeout, and its first claims waited about
// a second for backends that were still starting.
const warmParallel = 4

// warmStatementTimeout bounds one connection's warm-up statements. The
// warm-up's own deadline is checked between connections, never during a
// connection's statements: pgx closes a connection whose statement is cut
// short, and the pool would open it again when the workers need it.
const warmStatementTimeout = 5 * time.Second

// warmPool readies, before the workers start, the pool connections the
// workers will use at once, so that the first jobs after a start do not
// wait while the pool opens them: on a 2-core machine ten held workers met
// by 200 jobs/s made the first jobs wait 57-104 ms (docs/benchmarks.md).
// Held-mode handlers hold one each: one per worker and one per queue's
// claim, leaving one of the pool's; then every idle connection gets the
// held claims' statements prepared (primeClaims). Leased handlers hold
// none: a client whose kinds are all leased uses one per queue's claim, one
// for its grouped completions and one for its lease heartbeat, and
// warmStatements readies their statements on each. Best effort,
// warmParallel connections at a time, in two steps with a deadline of
// warmPoolTimeout each: the first begins no connection after its deadline,
// the second readies none after its own. A connection begun in time is
// opened and readied whatever it takes. Connections it did not get to are
// opened (and their statements prepared) when needed, as before.
//
// One deadline for both steps left a client of 50 workers on 2 cores with
// about 9 of 51 connections readied (opening them used the deadline up),
// and a connection still opening at the deadline joined the pool unready,
// the first one it hands out: the first job after a start parsed and
// planned the claim, 9-14 ms from commit to handler against 1-3 ms
// (TestStartReadiesTheConnectionsItOpens).
func (c *Client) warmPool(ctx context.Context) {
	if len(c.loops) == 0 {
		return
	}
	d := warmPoolTimeout
	if c.warmTimeout > 0 {
		d = c.warmTimeout
	}
	octx, ocancel := context.WithTimeout(ctx, d)
	held := c.openConns(octx)
	ocancel()
	rctx, rcancel := context.WithTimeout(ctx, d)
	defer rcancel()
	if c.onlyLeased {
		eachConn(rctx, held, func(ctx context.Context, i int, conn *pgxpool.Conn) {
			c.warmStatements(ctx, conn.Conn(), i)
		})
	}
	for _, conn := range held {
		conn.Release()
	}
	if c.onlyLeased {
		return
	}
	idle := c.pool.AcquireAllIdle(rctx)
	eachConn(rctx, idle, func(ctx context.Context, _ int, conn *pgxpool.Conn) {
		if err := c.primeClaims(ctx, conn.Conn()); err != nil {
			c.log.Debug("could not prepare a connection's claim statements", zap.Error(err))
		}
	})
	for _, conn := range idle {
		conn.Release()
	}
}

// eachConn runs f on each of conns (warmEach) until ctx is done.
func eachConn(ctx context.Context, conns []*pgxpool.Conn, f func(ctx context.Context, i int, conn *pgxpool.Conn)) {
	warmEach(ctx, len(conns), func(fctx context.Context, i int) bool {
		f(fctx, i, conns[i])
		return true
	})
}

// warmEach calls f for 0..n-1, warmParallel calls at a time, and begins
// none once ctx is done; a call that returns false ends its goroutine's
// share of the rest. f's context is ctx's values under a deadline of
// warmStatementTimeout instead of ctx's end: what the warm-up began, it
// finishes.
func warmEach(ctx context.Context, n int, f func(ctx context.Context, i int) bool) {
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	call := func(i int) bool {
		if ctx.Err() != nil {
			return false
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), warmStatementTimeout)
		defer cancel()
		return f(fctx, i)
	}
	var wg sync.WaitGroup
	for range min(warmParallel, n) {
		wg.Go(func() {
			for i := range next {
				if !call(i) {
					return
				}
			}
		})
	}
	wg.Wait()
}

// openConns acquires the connections warmPool readies, warmParallel at a
// time, holding each (so each is a distinct connection) until ctx is done
// or all are held: for a leased-only client its idle ones first (the ones
// the pool hands out next). A connection begun before ctx ended is opened
// and held.
func (c *Client) openConns(ctx context.Context) []*pgxpool.Conn {
	want := MinPoolConns(c.cfg) - 1
	if c.onlyLeased {
		want = len(c.loops) + 2
	}
	want = min(want, int(c.pool.Config().MaxConns)-1)
	if want <= 0 || (!c.onlyLeased && want <= int(c.pool.Stat().TotalConns())) {
		return nil
	}
	var held []*pgxpool.Conn
	if c.onlyLeased {
		held = c.pool.AcquireAllIdle(ctx)
	}
	var mu sync.Mutex
	// Not cut short by ctx (warmEach): a connection the deadline
	// interrupted while it opened would join the pool unready, and be the
	// first one it hands out.
	warmEach(ctx, max(want-len(held), 0), func(actx context.Context, _ int) bool {
		conn, err := c.pool.Acquire(actx)
		if err != nil {
			return false
		}
		mu.Lock()
		held = append(held, conn)
		mu.Unlock()
		return true
	})
	return held
}

// planWarmups is how many times warmStatements runs the leased claim on a
// connection: PostgreSQL plans a prepared statement for its parameters on
// each of its first five executions on a connection (custom plans) before
// it may settle on its generic plan, which the claim then uses.
const planWarmups = 5

// warmStatements readies on conn the statements of a leased loop's hot
// path, in one round trip, in a transaction it rolls back: it runs the
// claim of each queue planWarmups times (no job is started; a due job whose
// row it locked meanwhile is skipped by other clients' claims and seen by
// this client's first look), the idle mark (under a client id of the
// warm-up's own, warmer: the connections warmed at once do not wait for
// each other's row) and the idle barrier once, and the grouped completion
// (of no job) on its generic plan, as it runs (flush). Without it each
// connection the pool hands a claim parses it and plans it on each of its
// first executions: with a few connections in turn, the first few dozen
// jobs after a start each waited a parse or a plan longer. Only in pgx's
// default mode, which caches prepared statements per connection; best
// effort.
func (c *Client) warmStatements(ctx context.Context, conn *pgx.Conn, warmer int) {
	if conn.Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return
	}
	lease := float64(c.cfg.LeaseDuration.Microseconds())
	pb := &pgx.Batch{}
	for q := range c.loops {
		for range planWarmups {
			pb.Queue(c.sql.claimLeased, q, lease, c.id, c.leasedKinds, 1)
		}
		pb.Queue(c.sql.setWaiter, q, c.id+"/warm-up/"+strconv.Itoa(warmer), true)
		pb.Queue(c.sql.idleBarrier, q)
	}
	// The grouped completion runs with its generic plan (flush): plan it,
	// last, so that the setting does not reach the claims above.
	done := c.succeedBatch([]int64{}, []int32{}, map[int64]bool{})
	pb.QueuedQueries = append(pb.QueuedQueries, done.QueuedQueries...)
	if err := rolledBack(ctx, conn, pb); err != nil {
		c.log.Debug("could not ready a connection's leased statements", zap.Error(err))
	}
}

// rolledBack runs pb's statements on conn in one round trip, in a
// transaction it rolls back (also when one of them failed).
func rolledBack(ctx context.Context, conn *pgx.Conn, pb *pgx.Batch) error {
	tx := &pgx.Batch{}
	tx.Queue("BEGIN")
	tx.QueuedQueries = append(tx.QueuedQueries, pb.QueuedQueries...)
	tx.Queue("ROLLBACK")
	err := conn.SendBatch(ctx, tx).Close()
	if conn.PgConn().TxStatus() != 'I' {
		// Failed before its ROLLBACK.
		_, _ = conn.Exec(ctx, "ROLLBACK")
	}
	return err
}
