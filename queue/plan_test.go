package queue

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// The statements that move jobs by id probe the primary key even when the
// table's statistics say it is empty while 20,000 jobs are pending (a new
// table, a burst after a quiet spell). Checking the state with a plain
// "state = 'pending'" let the planner match the claim index's predicate and
// scan the whole claim index for the ids: 25-45 ms per completed batch.
func TestByIDStatementsProbeThePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, jobs := planTable(t)
	var err error
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, payload, state, leased_by, lease_expires_at)
		SELECT 'q', 'k', '{}', CASE WHEN i % 2 = 0 THEN 'pending' ELSE 'running' END,
			CASE WHEN i % 2 = 1 THEN 'w' END, CASE WHEN i % 2 = 1 THEN now() + interval '1 hour' END
		FROM generate_series(1, 20000) i`)
	require.NoError(t, err)

	s := newStatements(schema)
	cases := []struct {
		name, sql, args string
	}{
		{"succeed", s.succeed, `'{2,4,6}'::bigint[], '{2,4,6}'::bigint[], false`},
		{"fail", s.fail, `2, 0, 'e', 'pending', 0, 'ch', 'retry_scheduled'`},
		{"startLeased", s.startLeased, `'{2,4,6}'::bigint[], 1000, 'w'`},
		{"extendLeases", s.extendLeases, `'{1,3,5}'::bigint[], 1000, 'w'`},
		{"succeedLeased", s.succeedLeased, `'{1,3}'::bigint[], '{1,1}'::int[], 'w'`},
		{"failLeased", s.failLeased, `1, 1, 'e', 'pending', 0, 'ch', 'retry_scheduled', 'w'`},
	}
	// A connection of its own: the prepared statements and the setting
	// below must not reach the shared pool's connections.
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`) // as a prepared statement runs after five executions
	require.NoError(t, err)
	for _, tc := range cases {
		_, err := conn.Exec(ctx, `PREPARE p AS `+tc.sql)
		require.NoError(t, err, tc.name)
		rows, err := conn.Query(ctx, `EXPLAIN EXECUTE p(`+tc.args+`)`)
		require.NoError(t, err, tc.name)
		var lines []string
		for rows.Next() {
			var l string
			require.NoError(t, rows.Scan(&l))
			lines = append(lines, l)
		}
		require.NoError(t, rows.Err())
		text := strings.Join(lines, "\n")
		require.Contains(t, text, "jobs_pkey", "%s:\n%s", tc.name, text)
		require.NotContains(t, text, "jobs_claim_idx", "%s:\n%s", tc.name, text)
		require.NotContains(t, text, "jobs_lease_idx", "%s:\n%s", tc.name, text)
		_, err = conn.Exec(ctx, `DEALLOCATE p`)
		require.NoError(t, err)
	}
}

// A connection that ran the succeed statement while the table was small
// may keep a generic plan that seq-scans it; once a backlog has grown the
// table, every completed batch reads all of it (7.5-15 ms per batch of 32 in
// bench/peers/watermill's drain of 20,000 messages). complete runs
// probeByID first, so every plan of succeed, the generic one built on the
// small table included, probes the primary key.
func TestSucceedPlansForTheCurrentTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, jobs, conn := quietQueue(t, 0)
	var err error
	// After five runs PostgreSQL may settle on the generic plan, built then,
	// for the table as it was (seen in the bench's drain); force that choice.
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	// p's generic plan is built without the setting (the trap), q's with it
	// (as complete runs it).
	_, err = conn.Exec(ctx, `PREPARE p AS `+newStatements(schema).succeed)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `PREPARE q AS `+newStatements(schema).succeed)
	require.NoError(t, err)
	const args = `('{2,4,6}'::bigint[], '{2,4,6}'::bigint[], false)`
	explain := func(stmt, setting string) string {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer rollback(tx)
		if setting != "" {
			_, err = tx.Exec(ctx, setting)
			require.NoError(t, err)
		}
		rows, err := tx.Query(ctx, `EXPLAIN EXECUTE `+stmt+args)
		require.NoError(t, err)
		var lines []string
		for rows.Next() {
			var l string
			require.NoError(t, rows.Scan(&l))
			lines = append(lines, l)
		}
		require.NoError(t, rows.Err())
		return strings.Join(lines, "\n")
	}
	for _, build := range []struct{ stmt, setting string }{{"p", ""}, {"q", probeByID}} {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		if build.setting != "" {
			_, err = tx.Exec(ctx, build.setting)
			require.NoError(t, err)
		}
		_, err = tx.Exec(ctx, `EXECUTE `+build.stmt+args) // builds the generic plan
		require.NoError(t, err)
		rollback(tx)
	}
	// A backlog arrives; no ANALYZE yet.
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, payload)
		SELECT 'q', 'k', '{}' FROM generate_series(1, 20000)`)
	require.NoError(t, err)

	// The trap this guards against: the plan cached for the small table
	// scans the whole of it. Whether the planner takes that road for 300
	// rows varies (statistics, costs), so it is logged, not asserted; what
	// the fix promises is asserted below.
	if cached := explain("p", ""); strings.Contains(cached, "Seq Scan on jobs") {
		t.Logf("the cached generic plan scans the table, as in the bench's drain:\n%s", cached)
	} else {
		t.Logf("the cached generic plan did not scan the table this time:\n%s", cached)
	}
	planned := explain("q", probeByID)
	require.Contains(t, planned, "jobs_pkey", planned)
	require.NotContains(t, planned, "Seq Scan on jobs", planned)

	// The settings end with the statement: they are back as they were (the
	// session's force_generic_plan here, not the server's default) for
	// whatever runs before COMMIT (the event feed's commit-time trigger).
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer rollback(tx)
	_, err = tx.Exec(ctx, probeByID)
	require.NoError(t, err)
	var seqscan, mode string
	require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('enable_seqscan')`).Scan(&seqscan))
	require.Equal(t, "off", seqscan)
	_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = auto`) // as a statement in between might
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT `+probeByIDRestore)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('enable_seqscan'), current_setting('plan_cache_mode')`).Scan(&seqscan, &mode))
	require.Equal(t, "on", seqscan)
	require.Equal(t, "force_generic_plan", mode)
}

// The leased claim starts the head job through its ctid (a TID scan), even
// in a generic plan built while the table's statistics say it is empty and
// it holds 2,000 jobs; the start of the rest (ctid = ANY) does not run when
// there is no rest. With the whole set compared to ANY(ARRAY(...)) (ten rows
// expected), that plan scanned the whole table for every claim (40 of a
// one-job claim's 56 buffers in bench/peers' latency mode, auto_explain).
func TestClaimLeasedProbesTheLockedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, jobs := planTable(t)
	var err error
	_, err = pool.Exec(ctx, `ANALYZE `+jobs)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, payload, state, finished_at)
		SELECT 'q', 'lease', '{}', CASE WHEN i <= 2000 THEN 'succeeded' ELSE 'pending' END, CASE WHEN i <= 2000 THEN now() END
		FROM generate_series(1, 2001) i`)
	require.NoError(t, err)

	// A connection of its own: the prepared statement and the setting stay
	// off the pool.
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	s := newStatements(schema)
	for name, sql := range map[string]string{"claimLeased": s.claimLeased, "claimLeasedAfter": s.claimLeasedAfter} {
		_, err = conn.Exec(ctx, `PREPARE p AS `+sql)
		require.NoError(t, err, name)
		args := `'q', 1000, 'w', '{lease}'::text[], 8`
		if name == "claimLeasedAfter" {
			args += `, 0::smallint, '-infinity'::timestamptz, 0::bigint`
		}
		tx, err := conn.Begin(ctx)
		require.NoError(t, err, name)
		rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) EXECUTE p(`+args+`)`)
		require.NoError(t, err, name)
		var lines []string
		for rows.Next() {
			var l string
			require.NoError(t, rows.Scan(&l))
			lines = append(lines, l)
		}
		require.NoError(t, rows.Err())
		rollback(tx)
		text := strings.Join(lines, "\n")
		tidScans := 0
		for _, l := range lines {
			switch {
			case strings.Contains(l, "Tid Scan on jobs"):
				require.Contains(t, l, "(actual rows=1 loops=1)", "%s: the head, started:\n%s", name, text)
				tidScans++
			case strings.Contains(l, "Seq Scan"):
				require.Contains(t, l, "never executed", "%s:\n%s", name, text)
			}
		}
		require.Equal(t, 1, tidScans, "%s:\n%s", name, text)
		_, err = conn.Exec(ctx, `DEALLOCATE p`)
		require.NoError(t, err)
	}
}

// planTable migrates a schema of its own and returns its pool, the schema
// and its quoted jobs table, with autovacuum off on that table: its
// statistics stay what the test makes them (autovacuum may not analyze it).
func planTable(t *testing.T) (*pgxpool.Pool, string, string) {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaOn(t, pool)
	_, err := migrations.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	jobs := sqlident.Quote(schema, "jobs")
	_, err = pool.Exec(context.Background(), `ALTER TABLE `+jobs+` SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	return pool, schema, jobs
}

// quietQueue is planTable with a quiet queue 'q' in it (300 finished jobs
// and pending due ones, analyzed) and a connection of its own, so that
// prepared statements stay off the pool.
func quietQueue(t *testing.T, pending int) (pool *pgxpool.Pool, schema, jobs string, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	pool, schema, jobs = planTable(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, payload, state, finished_at)
		SELECT 'q', 'k', '{}', 'succeeded', now() FROM generate_series(1, 300)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind) SELECT 'q', 'k' FROM generate_series(1, $1::int)`, pending)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+jobs)
	require.NoError(t, err)
	conn, err = pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return pool, schema, jobs, conn
}

// The held claims and succeed put back the planner settings that the
// statement before them changed for their plan (genericPlan, probeByID)
// themselves, once their plan is chosen, as does the leased completion
// (genericPlan): no round trip sends a statement of its own to put them
// back. The settings come back
// as the session had them (not the server's defaults), with rows claimed or
// none, and the statements still ran on the plan the settings chose.
func TestPlanSettingsEndWithTheStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, jobs := planTable(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, payload) SELECT 'q', 'k', '{}' FROM generate_series(1, 3)`)
	require.NoError(t, err)
	s := newStatements(schema)
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer conn.Close(ctx)
	// A session setting of the user's, which the statements must keep.
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_custom_plan`)
	require.NoError(t, err)
	// run sends BEGIN, set, stmt and the settings' read in one round trip
	// (as claim and complete send them) and rolls back; it returns the
	// rows stmt returned and the settings after it.
	run := func(set, stmt string, args ...any) (n int, seqscan, mode, sync string) {
		t.Helper()
		pb := &pgx.Batch{}
		pb.Queue("BEGIN")
		pb.Queue(set)
		pb.Queue(stmt, args...).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				n++
			}
			return rows.Err()
		})
		pb.Queue(`SELECT pg_catalog.current_setting('enable_seqscan'), pg_catalog.current_setting('plan_cache_mode'),
			pg_catalog.current_setting('synchronous_commit')`).
			QueryRow(func(row pgx.Row) error { return row.Scan(&seqscan, &mode, &sync) })
		pb.Queue("ROLLBACK")
		require.NoError(t, conn.SendBatch(ctx, pb).Close())
		return n, seqscan, mode, sync
	}
	for _, tc := range []struct {
		name, set, stmt string
		args            []any
		rows            int
		async           bool // the statement set synchronous_commit off
	}{
		{"claimOne", genericPlan, s.claimOne, []any{"q"}, 1, false},
		{"claimOne, nothing due", genericPlan, s.claimOne, []any{"none"}, 0, false},
		{"claimPlain", genericPlan, s.claimPlain, []any{"q", 2}, 2, false},
		{"claim", genericPlan, s.claim, []any{"q", 2, []string{}, []string{}, 2}, 2, false},
		{"succeed", probeByID, s.succeed, []any{[]int64{1, 2}, []int64{1, 2}, true}, 2, true},
		{"succeed, flushed", probeByID, s.succeed, []any{[]int64{1, 2}, []int64{1, 2}, false}, 2, false},
		{"succeed, none", probeByID, s.succeed, []any{[]int64{}, []int64{}, false}, 0, false},
		{"succeedLeased, none", genericPlan, s.succeedLeased, []any{[]int64{}, []int32{}, "w"}, 0, false},
	} {
		n, seqscan, mode, sync := run(tc.set, tc.stmt, tc.args...)
		require.Equal(t, tc.rows, n, tc.name)
		require.Equal(t, map[bool]string{true: "off", false: "on"}[tc.async], sync, tc.name)
		require.Equal(t, "on", seqscan, tc.name)
		require.Equal(t, "force_custom_plan", mode, tc.name)
	}
	// Each statement ran on its generic plan: the settings were put back
	// after its plan was chosen, not before.
	rows, err := conn.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_catalog.pg_prepared_statements`)
	require.NoError(t, err)
	seen := 0
	for rows.Next() {
		var stmt string
		var generic, custom int64
		require.NoError(t, rows.Scan(&stmt, &generic, &custom))
		for _, want := range []string{s.claimOne, s.claimPlain, s.claim, s.succeed} {
			if stmt == want {
				seen++
				require.Zero(t, custom, stmt)
				require.Positive(t, generic, stmt)
			}
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 4, seen)
}

// claimFirst has no parameter, so the plan its first run on a connection
// makes is kept for good: made while the queue was nearly empty, it must
// still be a range scan of the claim index when a backlog arrives (20,000
// due jobs, 20,000 scheduled ahead at the same priority, no ANALYZE yet).
func TestClaimFirstPlanStaysARangeScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, jobs, conn := quietQueue(t, 1)
	_, err := conn.Exec(ctx, `PREPARE f AS `+newStatements(schema).claimFirst("q"))
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `EXECUTE f`) // makes the plan it keeps
	require.NoError(t, err)
	rollback(tx)

	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, run_after)
		SELECT 'q', 'k', now() + CASE WHEN i % 2 = 0 THEN interval '1 hour' ELSE -interval '1 hour' END + i * interval '1 ms'
		FROM generate_series(1, 40000) i`)
	require.NoError(t, err)
	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	defer rollback(tx)
	buffers, rows, plan := explainExecute(t, tx, `f`)
	t.Logf("claimFirst, planned on 1 pending job, run on 40,001: %d buffers", buffers)
	require.Equal(t, int64(1), rows)
	require.NotContains(t, plan, `"Seq Scan"`, plan)
	require.LessOrEqual(t, buffers, int64(60), plan)
}
