package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/sqlident"
)

// TestOneJobEnqueueWakeCheckInline: migration 0020's one-job path makes
// wake_needed()'s check itself, without calling the function (a call of
// more jobs still does, once per queue), and keeps its answers: with an
// idle waiter on the queue, READ COMMITTED sends the wake-up, "<queue>"
// for a due job and "<queue>|<ms>" for a later one; without one, nothing.
// Migration 0021's enqueue_one, which the Go client and enqueue() call for
// one job without a unique key, gives the same answers.
func TestOneJobEnqueueWakeCheckInline(t *testing.T) {
	t.Parallel()
	for name, call := range map[string]string{
		"enqueue_jobs": `SELECT e.ids[1] FROM %s.enqueue_jobs(ARRAY['k']::text[], queues => ARRAY['iq']::text[],
		delays => ARRAY[$1::interval]) e`,
		"enqueue_one": `SELECT %s.enqueue_one('k', queue => 'iq', delay => $1::interval)`,
		"enqueue":     `SELECT %s.enqueue('k', queue => 'iq', delay => $1::interval)`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			oneJobWakeCheck(t, call)
		})
	}
}

func oneJobWakeCheck(t *testing.T, call string) {
	pool, schema := migratedSchema(t)
	ctx := context.Background()
	q := sqlident.Quote(schema)
	one := fmt.Sprintf(call, q)
	calls := func(tx pgx.Tx) int64 {
		var n *int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_stat_get_xact_function_calls($1::regprocedure)`,
			schema+".wake_needed(text)").Scan(&n))
		if n == nil {
			return 0
		}
		return *n
	}
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `LISTEN `+pgx.Identifier{schema + "_wake"}.Sanitize())
	require.NoError(t, err)
	enqueue := func(delay string) (wakeNeededCalls int64) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SET LOCAL track_functions = 'all'`)
		require.NoError(t, err)
		var id int64
		require.NoError(t, tx.QueryRow(ctx, one, delay).Scan(&id))
		n := calls(tx)
		require.NoError(t, tx.Commit(ctx))
		return n
	}
	waitWake := func() (string, error) {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		n, err := conn.Conn().WaitForNotification(wctx)
		if err != nil {
			return "", err
		}
		return n.Payload, nil
	}

	require.Zero(t, enqueue("0"), "the one-job path called wake_needed()")
	_, err = waitWake()
	require.Error(t, err, "a wake-up with no waiter")

	_, err = pool.Exec(ctx, `INSERT INTO `+q+`.waiters (queue, client_id, idle) VALUES ('iq', 'w1', true)`)
	require.NoError(t, err)
	require.Zero(t, enqueue("0"))
	payload, err := waitWake()
	require.NoError(t, err, "an idle waiter is woken")
	require.Equal(t, "iq", payload)
	require.Zero(t, enqueue("10 seconds"))
	payload, err = waitWake()
	require.NoError(t, err)
	require.Regexp(t, `^iq\|(9|10)[0-9]{3}$`, payload)

	// A busy waiter is not woken.
	_, err = pool.Exec(ctx, `UPDATE `+q+`.waiters SET idle = false`)
	require.NoError(t, err)
	require.Zero(t, enqueue("0"))
	_, err = waitWake()
	require.Error(t, err, "a wake-up for a busy waiter")

	// More jobs still go through wake_needed(), once per queue.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL track_functions = 'all'`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT `+q+`.enqueue_jobs(ARRAY['k', 'k']::text[], queues => ARRAY['iq', 'iq']::text[])`)
	require.NoError(t, err)
	require.Equal(t, int64(1), calls(tx))
	require.NoError(t, tx.Rollback(ctx))
}

// TestOneJobEnqueueTakenIDRaises: a job without a unique key is a plain
// INSERT since migration 0020 (ON CONFLICT only when a key is given), so an
// id the jobs' sequence hands out again raises unique_violation on the
// primary key at once; ON CONFLICT DO NOTHING swallowed it, and the call
// raised 40001 ("unique keys kept changing state") after five rounds. A job
// with a unique key is still deduplicated.
func TestOneJobEnqueueTakenIDRaises(t *testing.T) {
	t.Parallel()
	pool, schema := migratedSchema(t)
	ctx := context.Background()
	q := sqlident.Quote(schema)
	var first int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT e.ids[1] FROM `+q+`.enqueue_jobs(ARRAY['k']::text[]) e`).Scan(&first))
	for i := 0; i < 6; i++ {
		_, err := pool.Exec(ctx, `SELECT `+q+`.enqueue_jobs(ARRAY['k']::text[])`)
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `SELECT pg_catalog.setval($1::regclass, $2, false)`, schema+".jobs_id_seq", first)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT `+q+`.enqueue_jobs(ARRAY['k']::text[])`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "23505", pgErr.Code, "%v", err)
	require.Equal(t, "jobs_pkey", pgErr.ConstraintName)

	var ids []int64
	var dups []bool
	_, err = pool.Exec(ctx, `SELECT pg_catalog.setval($1::regclass, (SELECT max(id) FROM `+q+`.jobs))`, schema+".jobs_id_seq")
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		require.NoError(t, pool.QueryRow(ctx, `SELECT e.ids, e.duplicates FROM `+q+`.enqueue_jobs(ARRAY['k']::text[],
			unique_keys => ARRAY['u']::text[]) e`).Scan(&ids, &dups))
		require.Equal(t, []bool{i == 1}, dups)
	}
}

// An enqueue of more jobs (or of one with a unique key) still inserts with
// ON CONFLICT DO NOTHING: when the jobs' sequence hands out taken ids it
// tries again, and after five rounds raises 40001 as before migration 0020
// (docs/sql.md's 23505 row).
func TestManyJobEnqueueTakenIDsRaiseSerializationFailure(t *testing.T) {
	t.Parallel()
	pool, schema := migratedSchema(t)
	ctx := context.Background()
	q := sqlident.Quote(schema)
	var first int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT e.ids[1] FROM `+q+`.enqueue_jobs(pg_catalog.array_fill('k'::text, ARRAY[40])) e`).Scan(&first))
	var err error
	for _, call := range []string{`ARRAY['k', 'k']::text[]`, `ARRAY['k']::text[], unique_keys => ARRAY['u']::text[]`} {
		_, err = pool.Exec(ctx, `SELECT pg_catalog.setval($1::regclass, $2, false)`, schema+".jobs_id_seq", first)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `SELECT `+q+`.enqueue_jobs(`+call+`)`)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", call, err)
		require.Equal(t, "40001", pgErr.Code, "%s: %v", call, err)
	}
}

// enqueue_one checks the payload's size against payload_limit (1 MiB by
// default, as enqueue_jobs), and not at all when it is NULL, as the Go
// client sends it (Config.MaxPayloadBytes was checked in Go).
func TestEnqueueOnePayloadLimit(t *testing.T) {
	t.Parallel()
	pool, schema := migratedSchema(t)
	ctx := context.Background()
	q := sqlident.Quote(schema)
	big := `{"big":"` + strings.Repeat("x", 1<<20) + `"}`
	_, err := pool.Exec(ctx, `SELECT `+q+`.enqueue_one('k', $1::jsonb)`, big)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "PW003", pgErr.Code)
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT `+q+`.enqueue_one('k', $1::jsonb, payload_limit => NULL)`, big).Scan(&id))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+q+`.jobs`).Scan(&n))
	require.Equal(t, 1, n, "only the call without a limit wrote a job")
}
