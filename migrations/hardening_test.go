package migrations_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// TestHardeningRepairsAndRefusesBadRows: rows written before migration 0009
// that no worker could finish (attempts at the int4 limit, a pending job with
// no attempt left, infinite run_after or created_at) are failed with an error
// naming the rule and a failed event, finished ones are clamped, good rows
// are untouched; the constraints end up validated and refuse such writes.
func TestHardeningRepairsAndRefusesBadRows(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := migrations.UpTo(ctx, pool, schema, 7)
	require.NoError(t, err)
	jobs := sqlident.Quote(schema, "jobs")
	insert := func(cols, vals string) int64 {
		t.Helper()
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+jobs+` (queue, kind, `+cols+`) VALUES ('q', 'k', `+vals+`) RETURNING id`).Scan(&id))
		return id
	}
	good := insert("attempts, max_attempts", "2, 5")
	badPending := []int64{
		insert("attempts, max_attempts", "2147483647, 2147483647"),
		insert("attempts, max_attempts", "5, 5"),
		insert("attempts", "-1"),
		insert("run_after", "'infinity'"),
		insert("run_after", "'-infinity'"),
		insert("created_at", "'infinity'"),
	}
	badRunning := insert("state, attempts, max_attempts, run_after, lease_expires_at", "'running', 1, 3, '-infinity', now()")
	noLease := insert("state, attempts, max_attempts", "'running', 1, 3")
	endlessLease := insert("state, attempts, max_attempts, lease_expires_at", "'running', 1, 3, 'infinity'")
	goodRunning := insert("state, attempts, max_attempts, lease_expires_at", "'running', 3, 3, now()")
	badFinished := insert("state, attempts, max_attempts, finished_at", "'succeeded', 9, 3, now()")

	ran, err := migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Contains(t, ran, 9)

	var state string
	var attempts, maxAttempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT state, attempts FROM `+jobs+` WHERE id = $1`, good).Scan(&state, &attempts))
	require.Equal(t, "pending", state)
	require.Equal(t, 2, attempts)
	require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM `+jobs+` WHERE id = $1`, goodRunning).Scan(&state))
	require.Equal(t, "running", state)
	for _, id := range append(badPending, badRunning, noLease, endlessLease) {
		var lastErr string
		var finite bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT state, attempts, max_attempts, last_error, isfinite(run_after) AND isfinite(created_at) FROM `+jobs+` WHERE id = $1`, id).
			Scan(&state, &attempts, &maxAttempts, &lastErr, &finite))
		require.Equal(t, "failed", state, "job %d", id)
		require.Contains(t, lastErr, "migration 0009")
		require.True(t, finite)
		require.True(t, attempts >= 0 && attempts <= maxAttempts, "job %d: %d of %d", id, attempts, maxAttempts)
		var events int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+sqlident.Quote(schema, "events")+` WHERE job_id = $1 AND type = 'failed'`, id).Scan(&events))
		require.Equal(t, 1, events, "job %d: failed event", id)
	}
	require.NoError(t, pool.QueryRow(ctx, `SELECT state, attempts FROM `+jobs+` WHERE id = $1`, badFinished).Scan(&state, &attempts))
	require.Equal(t, "succeeded", state)
	require.Equal(t, 3, attempts)

	var notValid int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conrelid = $1::regclass AND NOT convalidated`, jobs).Scan(&notValid))
	require.Zero(t, notValid)

	for _, bad := range []struct{ cols, vals string }{
		{"attempts, max_attempts", "2147483647, 2147483647"},
		{"attempts, max_attempts", "5, 5"},
		{"attempts", "-1"},
		{"state, attempts, max_attempts", "'failed', 6, 5"},
		{"run_after", "'infinity'"},
		{"run_after", "'-infinity'"},
		{"created_at", "'-infinity'"},
		{"state, attempts", "'running', 1"},
		{"state, attempts, lease_expires_at", "'running', 1, 'infinity'"},
	} {
		_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, `+bad.cols+`) VALUES ('q', 'k', `+bad.vals+`)`)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%v: %v", bad, err)
		require.Equal(t, "23514", pgErr.Code, "%v: %v", bad, err) // check_violation
	}
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET attempts = $2 WHERE id = $1`, good, math.MaxInt32)
	require.Error(t, err)
}

// TestUpReportsRowsThatBreakAConstraint: a NOT VALID constraint that rows
// break is reported as an *InvalidRowsError naming it, and Up validates it
// once the rows are fixed.
func TestUpReportsRowsThatBreakAConstraint(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	jobs := sqlident.Quote(schema, "jobs")
	_, err = pool.Exec(ctx, `ALTER TABLE `+jobs+` DROP CONSTRAINT jobs_finite_times_check;
		INSERT INTO `+jobs+` (queue, kind, run_after) VALUES ('q', 'k', 'infinity');
		ALTER TABLE `+jobs+` ADD CONSTRAINT jobs_finite_times_check CHECK (isfinite(run_after) AND isfinite(created_at)) NOT VALID`)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, pool, schema)
	var ire *migrations.InvalidRowsError
	require.ErrorAs(t, err, &ire)
	require.ErrorIs(t, err, migrations.ErrInvalidRows)
	require.Equal(t, "jobs_finite_times_check", ire.Constraint)
	_, err = pool.Exec(ctx, `DELETE FROM `+jobs+` WHERE NOT isfinite(run_after)`)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
}
