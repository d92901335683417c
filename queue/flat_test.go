package queue

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// explainBuffers prepares sql and runs it with args (SQL literals) under
// EXPLAIN (ANALYZE, BUFFERS) in tx: it returns the shared buffers the
// statement touched (hit + read, every node below the top one included) and
// the rows it returned. args "" runs it without parentheses (a statement
// with no parameter).
func explainBuffers(t *testing.T, tx pgx.Tx, sql, args string) (buffers, rows int64) {
	t.Helper()
	ctx := context.Background()
	_, err := tx.Exec(ctx, `PREPARE flat_p AS `+sql)
	require.NoError(t, err)
	if args != "" {
		args = "(" + args + ")"
	}
	buffers, rows, _ = explainExecute(t, tx, `flat_p`+args)
	_, err = tx.Exec(ctx, `DEALLOCATE flat_p`)
	require.NoError(t, err)
	return buffers, rows
}

// explainExecute runs EXECUTE exec (a prepared statement and its
// arguments) under EXPLAIN (ANALYZE, BUFFERS) in tx and returns the shared
// buffers it touched, the rows it returned and the plan in JSON.
func explainExecute(t *testing.T, tx pgx.Tx, exec string) (buffers, rows int64, plan string) {
	t.Helper()
	var out []byte
	require.NoError(t, tx.QueryRow(context.Background(), `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE `+exec).Scan(&out))
	var plans []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
			Rows int64 `json:"Actual Rows"`
		} `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(out, &plans), string(out))
	require.Len(t, plans, 1)
	return plans[0].Plan.Hit + plans[0].Plan.Read, plans[0].Plan.Rows, string(out)
}

// flatSchema migrates a fresh schema and returns it with its quoted jobs
// table.
func flatSchema(t *testing.T, pool *pgxpool.Pool) (string, string) {
	t.Helper()
	schema := pgtest.SchemaOn(t, pool)
	_, err := migrations.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	return schema, sqlident.Quote(schema, "jobs")
}

// A claim with nothing due, and the look-up of the next delayed job, read a
// few index pages however many jobs are scheduled ahead: 300,000 jobs 1 hour
// to 7 days ahead, over three priorities, next to a few due jobs of another
// queue. A scan of the claim index bounded by the queue alone read all
// 300,000 entries (about 2,000 buffers) for every claim. The bound holds
// whichever plan the planner picks: it counts buffers, not plan shapes.
func TestClaimCostIsFlatInFutureJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil) // its own: PREPARE and plan settings stay off the shared pool
	schema, jobs := flatSchema(t, pool)
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, priority, run_after)
		SELECT 'q', 'k', (i % 3)::smallint, now() + interval '1 hour' + (i % 10000) * interval '1 minute'
		FROM generate_series(1, 300000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind) SELECT 'other', 'k' FROM generate_series(1, 100)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+jobs)
	require.NoError(t, err)

	s := newStatements(schema)
	const head = `'q', 32, '{}'::text[], '{slow}'::text[], 8`
	const cursor = `0::smallint, '-infinity'::timestamptz, 0::bigint`
	const leased = `'q', 1000, 'w', '{k}'::text[], 8`
	cases := []struct {
		name, sql, args string
		rows            int64
	}{
		{"claim", s.claim, head, 0},
		{"claimAfter", s.claimAfter, head + ", " + cursor, 0},
		{"claimOne", s.claimOne, `'q'`, 0},
		{"claimFirst", s.claimFirst("q"), "", 0},
		{"claimPlain", s.claimPlain, `'q', 32`, 0},
		{"claimPlainAfter", s.claimPlainAfter, `'q', 32, ` + cursor, 0},
		{"claimLeased", s.claimLeased, leased, 0},
		{"claimLeasedAfter", s.claimLeasedAfter, leased + ", " + cursor, 0},
		{"next", s.next, `'q'`, 1},
	}
	inEachPlanMode(t, pool, func(mode string, tx pgx.Tx) {
		for _, tc := range cases {
			buffers, rows := explainBuffers(t, tx, tc.sql, tc.args)
			t.Logf("%s %s: %d buffers", mode, tc.name, buffers)
			require.LessOrEqual(t, buffers, int64(60), "%s %s", mode, tc.name)
			require.Equal(t, tc.rows, rows, "%s %s: rows", mode, tc.name)
		}
	})
}

// The priority walk keeps claim order (priority, run_after, id) across
// priorities, honours the cursor and locks only the rows it returns.
func TestClaimWalkOrderAndLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil) // its own: PREPARE and plan settings stay off the shared pool
	schema, jobs := flatSchema(t, pool)
	// Due jobs at priorities 2, 0, 1, 0, 2 (ids 1-5, older first), and
	// future jobs at every priority between them.
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (id, queue, kind, priority, run_after)
		SELECT i, 'q', 'k', (ARRAY[2, 0, 1, 0, 2])[i], now() - interval '1 minute' + i * interval '1 second'
		FROM generate_series(1, 5) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, queue, kind, priority, run_after)
		SELECT 100 + i, 'q', 'k', (i % 4)::smallint, now() + interval '1 hour' FROM generate_series(1, 40) i`)
	require.NoError(t, err)
	s := newStatements(schema)
	ids := func(tx pgx.Tx, sql string, args ...any) []int64 {
		t.Helper()
		rows, err := tx.Query(ctx, sql, args...)
		require.NoError(t, err)
		var out []int64
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			out = append(out, vals[0].(int64))
		}
		require.NoError(t, rows.Err())
		return out
	}
	var runAfter2, runAfter4 any
	require.NoError(t, pool.QueryRow(ctx, `SELECT run_after FROM `+jobs+` WHERE id = 2`).Scan(&runAfter2))
	require.NoError(t, pool.QueryRow(ctx, `SELECT run_after FROM `+jobs+` WHERE id = 4`).Scan(&runAfter4))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(tx)
	require.Equal(t, []int64{2, 4, 3}, ids(tx, s.claimPlain, "q", 3))
	// The other two due jobs are not locked; nor is any future job.
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(other)
	require.Equal(t, []int64{1, 5}, ids(other, `SELECT id FROM `+jobs+` WHERE run_after <= now() ORDER BY id FOR UPDATE SKIP LOCKED`))
	rollback(other)
	rollback(tx)

	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(tx)
	// After job 2 (priority 0): job 4, then priority 1 and 2.
	require.Equal(t, []int64{4, 3, 1}, ids(tx, s.claimPlainAfter, "q", 3, int16(0), runAfter2, int64(2)))
	require.Equal(t, []int64{2}, ids(tx, s.claimOne, "q"), "the head again: this transaction's own locks are not skipped")
	rollback(tx)

	// claimFirst: the head job when it is of the most urgent pending
	// priority; nothing when that priority has nothing due and unlocked
	// (the walk then looks further), though other priorities have.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(tx)
	require.Equal(t, []int64{2}, ids(tx, s.claimFirst("q")))
	other, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(other)
	require.Equal(t, []int64{4}, ids(other, s.claimFirst("q")), "job 2 is locked: the next of priority 0")
	third, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(third)
	require.Empty(t, ids(third, s.claimFirst("q")), "both due jobs of priority 0 locked")
	rollback(third)
	rollback(other)
	rollback(tx)

	// Head and rest: kind 'alone' runs alone; the rest of a batch follows
	// claim order and skips it.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET kind = 'alone' WHERE id = 3`)
	require.NoError(t, err)
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(tx)
	require.Equal(t, []int64{2, 4, 1, 5}, ids(tx, s.claim, "q", 8, []string{"alone"}, []string{}, 8))
	other, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(other)
	require.Equal(t, []int64{3}, ids(other, s.claim, "q", 8, []string{"alone"}, []string{}, 8))
	rollback(other)
	rollback(tx)
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(tx)
	require.Equal(t, []int64{3}, ids(tx, s.claimAfter, "q", 8, []string{"alone"}, []string{}, 8, int16(0), runAfter4, int64(4)))
	rollback(tx)
	// claimFirst with only future jobs at the most urgent priority: nothing,
	// and the walk finds priority 1's job.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET run_after = now() + interval '1 hour' WHERE id IN (2, 4)`)
	require.NoError(t, err)
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer rollback(tx)
	require.Empty(t, ids(tx, s.claimFirst("q")), "priority 0 has only future jobs")
	require.Equal(t, []int64{3}, ids(tx, s.claimOne, "q"), "the walk finds priority 1's")
}

// The leased claim is one statement: when the head job is leased it starts
// it and the next leased jobs in claim order (running, attempt counted, a
// lease, a started event each), skipping held ones; when the head is held
// it starts nothing and says so.
func TestClaimLeasedStartsInOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema, jobs := flatSchema(t, pool)
	// Due jobs 1-5, older first, at priorities 1, 0, 1, 0, 1: claim order
	// 2, 4, 1, 3, 5. Job 4 is of a held kind.
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (id, queue, kind, priority, run_after, attempts)
		SELECT i, 'q', CASE WHEN i = 4 THEN 'held' ELSE 'lease' END, (ARRAY[1, 0, 1, 0, 1])[i],
			now() - interval '1 minute' + i * interval '1 second', CASE WHEN i = 1 THEN 2 ELSE 0 END
		FROM generate_series(1, 5) i`)
	require.NoError(t, err)
	s := newStatements(schema)
	claim := func(n int) (ids []int64, attempts []int32, started []bool) {
		t.Helper()
		rows, err := pool.Query(ctx, s.claimLeased, "q", float64(time.Minute.Microseconds()), "w", []string{"lease"}, n)
		require.NoError(t, err)
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			ids = append(ids, vals[0].(int64))
			attempts = append(attempts, vals[5].(int32))
			started = append(started, vals[len(vals)-1].(bool))
		}
		require.NoError(t, rows.Err())
		return ids, attempts, started
	}
	ids, attempts, started := claim(2)
	require.Equal(t, []int64{2, 1}, ids, "the head, then the next leased job past the held one")
	require.Equal(t, []int32{0, 2}, attempts, "attempts as before the claim")
	require.Equal(t, []bool{true, true}, started)
	var running, leasedBy, events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'running' AND lease_expires_at > now()),
		count(*) FILTER (WHERE leased_by = 'w'), (SELECT count(*) FROM `+sqlident.Quote(schema, "events")+`
			WHERE type = 'started' AND (job_id, attempt) IN ((2, 1), (1, 3)))
		FROM `+jobs+` WHERE id IN (1, 2) AND attempts = CASE id WHEN 1 THEN 3 ELSE 1 END`).Scan(&running, &leasedBy, &events))
	require.Equal(t, []int{2, 2, 2}, []int{running, leasedBy, events})

	ids, _, started = claim(8)
	require.Equal(t, []int64{4}, ids, "the held head")
	require.Equal(t, []bool{false}, started)
	var pending int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+jobs+` WHERE state = 'pending' AND attempts = 0 AND id IN (3, 4, 5)`).Scan(&pending))
	require.Equal(t, 3, pending, "a held head starts nothing")
}

// A leased claim does not look up attempt records for jobs of leased kinds
// (leased claims write none): a record left by a client that ran the kind in
// held mode and lost the attempt does not hold the job back; the claim
// counts a new attempt and the record, now stale, is pruned. A held job with
// such a record is still left to claimRecovered: it is neither the head nor
// started.
func TestClaimLeasedIgnoresAttemptRecordsOfLeasedKinds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema, jobs := flatSchema(t, pool)
	attempts := sqlident.Quote(schema, "attempts")
	// Claim order 1, 2, 3: 1 is held with a lost attempt, 2 is leased with
	// one, 3 is leased without.
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (id, queue, kind, run_after)
		SELECT i, 'q', CASE WHEN i = 1 THEN 'held' ELSE 'lease' END, now() - interval '1 minute' + i * interval '1 second'
		FROM generate_series(1, 3) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+attempts+` (job_id, queue, attempt, batch, client_id) VALUES (1, 'q', 1, 1, 'gone'), (2, 'q', 1, 1, 'gone')`)
	require.NoError(t, err)
	s := newStatements(schema)
	rows, err := pool.Query(ctx, s.claimLeased, "q", float64(time.Minute.Microseconds()), "w", []string{"lease"}, 8)
	require.NoError(t, err)
	var ids []int64
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		require.True(t, vals[len(vals)-1].(bool), "started")
		ids = append(ids, vals[0].(int64))
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{2, 3}, ids)
	var running int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+jobs+` WHERE id IN (2, 3) AND state = 'running' AND attempts = 1`).Scan(&running))
	require.Equal(t, 2, running)
	_, err = pool.Exec(ctx, s.pruneStarts)
	require.NoError(t, err)
	var left []int64
	rows, err = pool.Query(ctx, `SELECT job_id FROM `+attempts+` ORDER BY job_id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		left = append(left, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{1}, left, "the held job's record stays for claimRecovered; the leased job's is pruned")
}

// Retention makes progress under a 50 ms statement_timeout with 200,000
// failed jobs kept inside their 7-day window: each state is deleted with its
// own cutoff, and a batch reads the rows it deletes, not the rows kept
// (before, a batch of succeeded jobs stepped over all 200,000 older failed
// jobs kept: about 100 ms, and the cleaner never deleted anything under that
// timeout).
func TestRetentionIsFlatInKeptJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil) // its own: PREPARE and plan settings stay off the shared pool
	schema, jobs := flatSchema(t, pool)
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, state, attempts, finished_at)
		SELECT 'q', 'k', s.state, 1, now() - s.age - (i % s.n) * s.spread
		FROM (VALUES ('failed', interval '2 days', 200000, interval '2 seconds'), ('failed', interval '8 days', 3000, interval '1 second'),
			('succeeded', interval '25 hours', 2500, interval '1 second'), ('succeeded', interval '1 hour', 1000, interval '1 second'),
			('cancelled', interval '2 days', 10, interval '1 second')) AS s(state, age, n, spread),
			generate_series(1, s.n) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+jobs)
	require.NoError(t, err)

	// One batch of 100 succeeded jobs reads about what it deletes, not the
	// older failed jobs kept.
	s := newStatements(schema)
	inEachPlanMode(t, pool, func(mode string, tx pgx.Tx) {
		// The steady state: the expired failed jobs went in an earlier pass.
		_, err = tx.Exec(ctx, `DELETE FROM `+jobs+` WHERE state = 'failed' AND finished_at < now() - interval '7 days'`)
		require.NoError(t, err)
		buffers, _ := explainBuffers(t, tx, s.deleteFinished, `'succeeded', 86400e6, 100`)
		t.Logf("%s deleteFinished: %d buffers", mode, buffers)
		require.LessOrEqual(t, buffers, int64(1500), mode) // about 5 per row deleted; the single-index statement read 4,220 (custom plan) to 6,937 (generic)
	})

	slow := pgtest.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "50ms" })
	c, err := New(slow, Config{Schema: schema})
	require.NoError(t, err)
	n, err := c.DeleteFinished(ctx, Retention{})
	require.NoError(t, err)
	require.Equal(t, map[JobState]int64{StateSucceeded: 2500, StateCancelled: 10, StateFailed: 3000}, n)
	var kept int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+jobs).Scan(&kept))
	require.Equal(t, 201000, kept)
}

// A batch the server cancels (statement_timeout) is retried smaller: with
// every row's delete made to take 2 ms, no batch of 1,000 (or of 50) fits
// in a 50 ms statement_timeout, and DeleteFinished still deletes every
// expired job.
func TestRetentionShrinksCancelledBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil)
	schema, jobs := flatSchema(t, pool)
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, state, attempts, finished_at)
		SELECT 'q', 'k', 'succeeded', 1, now() - interval '2 days' FROM generate_series(1, 120)`)
	require.NoError(t, err)
	slowDelete := sqlident.Quote(schema, "slow_delete")
	_, err = pool.Exec(ctx, `CREATE FUNCTION `+slowDelete+`() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN PERFORM pg_sleep(0.002); RETURN OLD; END $$`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TRIGGER slow_delete BEFORE DELETE ON `+jobs+` FOR EACH ROW EXECUTE FUNCTION `+slowDelete+`()`)
	require.NoError(t, err)

	slow := pgtest.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "50ms" })
	// A full batch is cancelled.
	_, err = slow.Exec(ctx, newStatements(schema).deleteFinished, StateSucceeded, 86400e6, deleteBatch)
	require.Error(t, err)
	c, err := New(slow, Config{Schema: schema})
	require.NoError(t, err)
	n, err := c.DeleteFinished(ctx, Retention{})
	require.NoError(t, err)
	require.Equal(t, map[JobState]int64{StateSucceeded: 120}, n)
}

// A claim from the cursor does not read the index entries before the
// cursor: 40,000 jobs, the first 30,000 finished while a snapshot older than
// their completion is open (in a drain: other workers' claims, vacuum not
// yet by), so their claim index entries still point at row versions that
// must be visited. The priority walk's first probe, bounded by the cursor's
// priority alone, and its range scan, which PostgreSQL 15 started at the
// priority's first entry, stepped over all of them for every claim from the
// cursor: 760-980 buffers per claim here, 13-200 since. The bounds are each
// claim's buffers now (32 jobs locked, their attempt records probed) with a
// margin of about 65.
func TestCursorClaimsSkipTheJobsBeforeTheCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil) // its own: PREPARE and plan settings stay off the shared pool
	schema, jobs := flatSchema(t, pool)
	finishedUnderOldSnapshot(t, pool, jobs)
	var cursor string
	require.NoError(t, pool.QueryRow(ctx, `SELECT format('0::smallint, %L::timestamptz, 30000::bigint', run_after)
		FROM `+jobs+` WHERE id = 30000`).Scan(&cursor))

	s := newStatements(schema)
	cases := []struct {
		name, sql, args string
		max             int64
	}{
		{"claimPlainAfter", s.claimPlainAfter, `'q', 32, ` + cursor, 200},
		{"claimAfter", s.claimAfter, `'q', 32, '{}'::text[], '{}'::text[], 8, ` + cursor, 260},
		{"claimLeasedAfter", s.claimLeasedAfter, `'q', 1000, 'w', '{}'::text[], 8, ` + cursor, 80},
	}
	inEachPlanMode(t, pool, func(mode string, tx pgx.Tx) {
		for _, tc := range cases {
			buffers, rows := explainBuffers(t, tx, tc.sql, tc.args)
			t.Logf("%s %s: %d buffers", mode, tc.name, buffers)
			require.LessOrEqual(t, buffers, tc.max, "%s %s", mode, tc.name)
			require.Positive(t, rows, "%s %s: rows", mode, tc.name)
		}
	})
}

// The walk of the jobs a claim takes after its head starts at the head: it
// does not step over the index entries before the head again. 40,000 jobs,
// the first 30,000 finished while an older snapshot is open (as in
// TestCursorClaimsSkipTheJobsBeforeTheCursor), claimed from the head of the
// index or from a cursor before them, so the head's walk reads them (about
// 990 buffers: claimOne's). What a claim reads beyond claimOne is its rest:
// claimLeased's walk, bounded by the row (priority, run_after, id) > head,
// stepped over their index entries (8 jobs: 214-223 buffers; 67-76 since),
// and claim's, with no bound at the head, visited them again (leased head,
// 8 jobs: 542-551, 55-64 since; held, 32 jobs: 665-674, 154-163 since).
// The bounds are the figures since with a margin.
func TestClaimRestSkipsTheJobsBeforeTheHead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil) // its own: PREPARE and plan settings stay off the shared pool
	schema, jobs := flatSchema(t, pool)
	finishedUnderOldSnapshot(t, pool, jobs)
	const cursor = `0::smallint, '-infinity'::timestamptz, 0::bigint` // before every job

	s := newStatements(schema)
	cases := []struct {
		name, sql, args string
		rows, max       int64 // max: buffers beyond claimOne's
	}{
		{"claimLeased", s.claimLeased, `'q', 1000, 'w', '{k}'::text[], 8`, 8, 120},
		{"claimLeasedAfter", s.claimLeasedAfter, `'q', 1000, 'w', '{k}'::text[], 8, ` + cursor, 8, 120},
		{"claim leased", s.claim, `'q', 32, '{}'::text[], '{k}'::text[], 8`, 8, 120},
		{"claim held", s.claim, `'q', 32, '{}'::text[], '{}'::text[], 8`, 32, 320},
		{"claimAfter held", s.claimAfter, `'q', 32, '{}'::text[], '{}'::text[], 8, ` + cursor, 32, 320},
	}
	inEachPlanMode(t, pool, func(mode string, tx pgx.Tx) {
		head, _ := explainBuffers(t, tx, s.claimOne, `'q'`)
		for _, tc := range cases {
			_, err := tx.Exec(ctx, `SAVEPOINT c`) // claimLeased starts its jobs
			require.NoError(t, err)
			buffers, rows := explainBuffers(t, tx, tc.sql, tc.args)
			_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT c`)
			require.NoError(t, err)
			t.Logf("%s %s: %d buffers (claimOne: %d)", mode, tc.name, buffers, head)
			require.LessOrEqual(t, buffers-head, tc.max, "%s %s", mode, tc.name)
			require.Equal(t, tc.rows, rows, "%s %s: rows", mode, tc.name)
		}
	})
}

// The jobs a claim takes after its head are the next unlocked ones after the
// head in claim order, across priorities, before (locked jobs of the head's
// priority and an earlier one) and after (a later one) the head's: 12 jobs
// over priorities 0, 1 and 2, some locked by another transaction.
func TestClaimRestTakesTheJobsAfterTheHead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil)
	schema, jobs := flatSchema(t, pool)
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, priority, run_after)
		SELECT 'q', 'k', ((i - 1) / 4)::smallint, now() - interval '1 hour' + i * interval '1 ms' FROM generate_series(1, 12) i`)
	require.NoError(t, err)
	s := newStatements(schema)
	claims := []struct {
		name, sql string
		args      []any
	}{
		{"claim", s.claim, []any{"q", 6, []string{}, []string{}, 6}},
		{"claim leased", s.claim, []any{"q", 6, []string{}, []string{"k"}, 6}},
		{"claimLeased", s.claimLeased, []any{"q", 1000.0, "w", []string{"k"}, 6}},
		{"claimAfter", s.claimAfter, []any{"q", 6, []string{}, []string{}, 6, int16(0), time.Time{}, int64(0)}},
	}
	for _, tc := range []struct{ locked, want []int64 }{
		{[]int64{1, 2, 6}, []int64{3, 4, 5, 7, 8, 9}},
		{[]int64{1, 2, 3, 4, 7}, []int64{5, 6, 8, 9, 10, 11}},
	} {
		locker, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer rollback(locker)
		_, err = locker.Exec(ctx, `SELECT id FROM `+jobs+` WHERE id = ANY($1) FOR UPDATE`, tc.locked)
		require.NoError(t, err)
		for _, c := range claims {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer rollback(tx)
			rows, err := tx.Query(ctx, c.sql, c.args...)
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int64, error) {
				var id int64
				return id, r.Scan(append([]any{&id}, make([]any, len(r.FieldDescriptions())-1)...)...)
			})
			rollback(tx)
			require.NoError(t, err)
			require.Equal(t, tc.want, got, "%s, %v locked", c.name, tc.locked)
		}
		rollback(locker)
	}
}

// inEachPlanMode runs f in a transaction of pool for each plan_cache_mode
// the store's statements may run under, custom and generic plans, and
// rolls it back (also when a check fails: the schema must not stay locked).
func inEachPlanMode(t *testing.T, pool *pgxpool.Pool, f func(mode string, tx pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		func() {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer rollback(tx)
			_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = `+mode)
			require.NoError(t, err)
			f(mode, tx)
		}()
	}
}

// finishedUnderOldSnapshot fills jobs with 40,000 due jobs of queue q and
// marks the first 30,000 succeeded while a snapshot older than their
// completion stays open until the test ends (in a drain: other workers'
// claims, vacuum not yet by), so their claim index entries still point at
// row versions that must be visited.
func finishedUnderOldSnapshot(t *testing.T, pool *pgxpool.Pool, jobs string) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, run_after)
		SELECT 'q', 'k', now() - interval '1 hour' + i * interval '1 ms' FROM generate_series(1, 40000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+jobs)
	require.NoError(t, err)
	old, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { rollback(old) })
	_, err = old.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = old.Exec(ctx, `SELECT count(*) FROM `+jobs) // takes the snapshot
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET state = 'succeeded', finished_at = now() WHERE id <= 30000`)
	require.NoError(t, err)
}
