package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// evilOperators shadow, for a session whose search_path puts their schema
// before pg_catalog, every operator valid_job's expression and the one-job
// wake-up check use; each records that it ran.
var evilOperators = []struct{ op, left, right, fn string }{
	{"=", "text", "text", "texteq"}, {"<>", "text", "text", "textne"},
	{"~", "text", "text", "textregexeq"}, {"!~", "text", "text", "textregexne"},
	{"<=", "integer", "integer", "int4le"}, {">=", "integer", "integer", "int4ge"},
	{">=", "interval", "interval", "interval_ge"}, {">", "timestamptz", "timestamptz", "timestamptz_gt"},
}

// TestValidJobIsInlinedAndQualified: migration 0019's valid_job has no SET
// clause (so the planner inlines it into the enqueue statement) and resolves
// every name in pg_catalog whatever the caller's search_path: a session
// whose search_path puts a schema with look-alike operators before
// pg_catalog gets the same answers and errors, and none of those operators
// runs, in valid_job called directly and in enqueue_jobs.
func TestValidJobIsInlinedAndQualified(t *testing.T) {
	t.Parallel()
	pool, schema := migratedSchema(t)
	ctx := context.Background()
	q := sqlident.Quote(schema)
	var lang string
	var config []string
	var secdef bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT l.lanname, p.proconfig, p.prosecdef FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.oid = $1::regprocedure`, schema+".valid_job(bigint, text, jsonb, text, timestamptz, interval, integer, integer, text, integer)").
		Scan(&lang, &config, &secdef))
	require.Equal(t, "sql", lang)
	require.Empty(t, config)
	require.False(t, secdef)

	evil := schema + "_evil"
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+sqlident.Quote(evil)+` CASCADE`)
	})
	_, err = conn.Exec(ctx, `CREATE SCHEMA `+sqlident.Quote(evil)+`; CREATE TABLE `+sqlident.Quote(evil, "pwned")+` (what text)`)
	require.NoError(t, err)
	for i, o := range evilOperators {
		fn := sqlident.Quote(evil, "f"+strings.Repeat("x", i))
		_, err := conn.Exec(ctx, `CREATE FUNCTION `+fn+`(`+o.left+`, `+o.right+`) RETURNS boolean LANGUAGE sql AS $$
			INSERT INTO `+sqlident.Quote(evil, "pwned")+` VALUES ('`+o.op+`'); SELECT pg_catalog.`+o.fn+`($1, $2) $$;
			CREATE OPERATOR `+sqlident.Quote(evil)+`.`+o.op+` (LEFTARG = `+o.left+`, RIGHTARG = `+o.right+`, FUNCTION = `+fn+`)`)
		require.NoError(t, err, o.op)
	}
	_, err = conn.Exec(ctx, `SET search_path = `+sqlident.Quote(evil)+`, pg_catalog`)
	require.NoError(t, err)
	pwned := func() int {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM `+sqlident.Quote(evil, "pwned")).Scan(&n))
		return n
	}
	// The trap works: an unqualified comparison runs the look-alike.
	_, err = conn.Exec(ctx, `SELECT 'a'::text <> 'b'::text, 1 >= 2`)
	require.NoError(t, err)
	require.Equal(t, 2, pwned())
	_, err = conn.Exec(ctx, `TRUNCATE `+sqlident.Quote(evil, "pwned"))
	require.NoError(t, err)

	validJob := q + `.valid_job(1, $1::text, $2::jsonb, $3::text, $4::timestamptz, $5::interval, $6::integer, $7::integer, $8::text, 100)`
	var ok bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT `+validJob, "k", `{"a":1}`, "q", nil, "1 second", 3, 2, "key").Scan(&ok))
	require.True(t, ok)
	// Inlined: the plan's expression is valid_job's body, not a call.
	rows, err := conn.Query(ctx, `EXPLAIN (VERBOSE, FORMAT TEXT) SELECT `+validJob, "k", nil, nil, nil, nil, nil, nil, nil)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "Output:")
	require.NotContains(t, plan, "valid_job")
	for _, c := range []struct {
		code string
		args []any
	}{
		{"PW002", []any{"k", nil, "Bad Queue", nil, nil, nil, nil, nil}},
		{"PW001", []any{"", nil, nil, nil, nil, nil, nil, nil}},
		{"PW001", []any{"a kind", nil, nil, nil, nil, nil, nil, nil}},
		{"PW003", []any{"k", `{"a":"` + strings.Repeat("x", 100) + `"}`, nil, nil, nil, nil, nil, nil}},
		{"PW004", []any{"k", nil, nil, nil, nil, 40000, nil, nil}},
		{"PW005", []any{"k", nil, nil, "infinity", nil, nil, nil, nil}},
		{"PW005", []any{"k", nil, nil, nil, "-1 second", nil, nil, nil}},
		{"PW006", []any{"k", nil, nil, nil, nil, nil, 0, nil}},
		{"PW007", []any{"k", nil, nil, nil, nil, nil, nil, strings.Repeat("u", 1025)}},
	} {
		err := conn.QueryRow(ctx, `SELECT `+validJob, c.args...).Scan(&ok)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%v: %v", c.args, err)
		require.Equal(t, c.code, pgErr.Code, "%v: %v", c.args, err)
	}
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	var ids []int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT e.ids FROM `+q+`.enqueue_jobs(ARRAY['k']::text[], queues => ARRAY['q']::text[],
		delays => ARRAY['1 second']::interval[], unique_keys => ARRAY['u']::text[]) e`).Scan(&ids))
	require.Len(t, ids, 1)
	_, err = tx.Exec(ctx, `SELECT `+q+`.enqueue_jobs(ARRAY['k']::text[], queues => ARRAY['Bad']::text[])`)
	require.Error(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, pwned(), "a look-alike operator ran")
}

// TestOneJobEnqueueWakeCheck: the one-job statement rewritten by migration
// 0019 keeps wake_needed()'s protocol: in READ COMMITTED it
// holds the queue's wake key shared until the commit (what a worker's idle
// barrier waits for); in REPEATABLE READ it takes no lock and notifies.
// With no event watcher the transaction is marked so that the events
// trigger queues nothing; with one, it still notifies the watchers at
// commit.
func TestOneJobEnqueueWakeCheck(t *testing.T) {
	t.Parallel()
	pool, schema := migratedSchema(t)
	ctx := context.Background()
	q := sqlident.Quote(schema)
	enqueue := `SELECT e.ids[1] FROM ` + q + `.enqueue_jobs(ARRAY['k']::text[], queues => ARRAY['wq']::text[]) e`
	wakeLocks := func(tx pgx.Tx) int {
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks l WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory'
			AND l.mode = 'ShareLock' AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = `+q+`.wake_lock_key('wq')`).Scan(&n))
		return n
	}
	lc, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer lc.Release()
	_, err = lc.Exec(ctx, `LISTEN `+pgx.Identifier{schema + "_events"}.Sanitize())
	require.NoError(t, err)

	// No watcher when the statement runs: the commit sends nothing, even
	// for a watcher registered later in the same transaction (before 0019
	// the commit looked, and notified it).
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var id int64
	require.NoError(t, tx.QueryRow(ctx, enqueue).Scan(&id))
	require.Equal(t, 1, wakeLocks(tx), "read committed: the wake key held shared")
	_, err = tx.Exec(ctx, `INSERT INTO `+q+`.event_watchers (id) VALUES ('late')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = lc.Conn().WaitForNotification(wctx)
	cancel()
	require.Error(t, err, "notified with no watcher at the enqueue")
	_, err = pool.Exec(ctx, `DELETE FROM `+q+`.event_watchers`)
	require.NoError(t, err)

	// The listening connection is held past the commit (a pool.BeginTx's
	// connection goes back to the pool at Commit, to other parallel tests).
	rc, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer rc.Release()
	conn := rc.Conn()
	tx, err = conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LISTEN `+pgx.Identifier{schema + "_wake"}.Sanitize())
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, enqueue).Scan(&id))
	require.Zero(t, wakeLocks(tx), "repeatable read: no lock taken")
	require.NoError(t, tx.Commit(ctx))
	wctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	n, err := conn.WaitForNotification(wctx)
	cancel()
	require.NoError(t, err, "repeatable read: a wake-up is sent")
	require.Equal(t, "wq", n.Payload)
	_, err = conn.Exec(ctx, `UNLISTEN *`)
	require.NoError(t, err)

	// A watcher: the commit notifies <schema>_events.
	_, err = pool.Exec(ctx, `INSERT INTO `+q+`.event_watchers (id) VALUES ('t')`)
	require.NoError(t, err)
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, enqueue).Scan(&id))
	require.NoError(t, tx.Commit(ctx))
	wctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = lc.Conn().WaitForNotification(wctx)
	require.NoError(t, err, "a watcher is notified at commit")
}

// migratedSchema is a fresh schema with every migration applied, on the
// shared test pool.
func migratedSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	_, err := migrations.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	return pool, schema
}
