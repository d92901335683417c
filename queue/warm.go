package queue

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// warmPoolTimeout bounds warmPool.
const warmPoolTimeout = 500 * time.Millisecond

// warmPool readies, before the workers start, the pool connections the
// workers will use at once, so that the first jobs after a start do not
// wait while the pool opens them: on a 2-core machine ten held workers met
// by 200 jobs/s made the first jobs wait 57-104 ms (docs/benchmarks.md).
// Held-mode handlers hold one each: one per worker and one per queue's
// claim, leaving one of the pool's. Leased handlers hold none: a client
// whose kinds are all leased uses one per queue's claim, one for its
// grouped completions and one for its lease heartbeat, and warmStatements
// also readies their statements on each. Best effort, within
// warmPoolTimeout: connections it cannot get now are opened when needed,
// as before.
func (c *Client) warmPool(ctx context.Context) {
	if len(c.loops) == 0 {
		return
	}
	want := MinPoolConns(c.cfg) - 1
	if c.onlyLeased {
		want = len(c.loops) + 2
	}
	want = min(want, int(c.pool.Config().MaxConns)-1)
	if want <= 0 || (!c.onlyLeased && want <= int(c.pool.Stat().TotalConns())) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, warmPoolTimeout)
	defer cancel()
	var held []*pgxpool.Conn
	if c.onlyLeased {
		// The idle connections are the ones the pool hands out next.
		held = c.pool.AcquireAllIdle(ctx)
	}
	got := make(chan *pgxpool.Conn, max(want-len(held), 0))
	var wg sync.WaitGroup
	for range cap(got) {
		wg.Go(func() {
			if conn, err := c.pool.Acquire(ctx); err == nil {
				got <- conn
			}
		})
	}
	wg.Wait() // every connection is held at once, so each is a distinct one
	close(got)
	for conn := range got {
		held = append(held, conn)
	}
	for _, conn := range held {
		if c.onlyLeased {
			wg.Go(func() { c.warmStatements(ctx, conn.Conn()) })
		}
	}
	wg.Wait()
	for _, conn := range held {
		conn.Release()
	}
}

// planWarmups is how many times warmStatements runs the leased claim on a
// connection: PostgreSQL plans a prepared statement for its parameters on
// each of its first five executions on a connection (custom plans) before
// it may settle on its generic plan, which the claim then uses.
const planWarmups = 5

// warmStatements prepares on conn the statements of a leased loop's hot
// path (the claim, the grouped completion, the idle mark and barrier) and
// runs the claim of each queue planWarmups times in a transaction it rolls
// back (no job is started; rows it locked meanwhile are skipped by other
// claims and seen by this client's first look). Without it each connection
// the pool hands a claim parses it once and plans it on each of its first
// executions: with a few connections in turn, the first few dozen jobs
// after a start each waited a parse or a plan longer (0.5-2 ms on a loaded
// 2-core machine, docs/benchmarks.md). Only in pgx's default mode, which
// caches prepared statements per connection; best effort.
func (c *Client) warmStatements(ctx context.Context, conn *pgx.Conn) {
	if conn.Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return
	}
	for _, sql := range []string{c.sql.succeedLeased, c.sql.setWaiter, c.sql.idleBarrier} {
		if _, err := conn.Prepare(ctx, sql, sql); err != nil {
			return
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return
	}
	defer rollback(tx)
	lease := float64(c.cfg.LeaseDuration.Microseconds())
	for q := range c.loops {
		for range planWarmups {
			rows, err := tx.Query(ctx, c.sql.claimLeased, q, lease, c.id, c.leasedKinds, 1)
			if err != nil {
				return
			}
			rows.Close()
			if rows.Err() != nil {
				return
			}
		}
	}
}
