package queue

import (
	"context"
	"strings"
	"testing"

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
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaOn(t, pool)
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	jobs := sqlident.Quote(schema, "jobs")
	// Statistics stay as a new table's: autovacuum may not analyze it.
	_, err = pool.Exec(ctx, `ALTER TABLE `+jobs+` SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, payload, state, leased_by, lease_expires_at)
		SELECT 'q', 'k', '{}', CASE WHEN i % 2 = 0 THEN 'pending' ELSE 'running' END,
			CASE WHEN i % 2 = 1 THEN 'w' END, CASE WHEN i % 2 = 1 THEN now() + interval '1 hour' END
		FROM generate_series(1, 20000) i`)
	require.NoError(t, err)

	s := newStatements(schema)
	cases := []struct {
		name, sql, args string
	}{
		{"succeed", s.succeed, `'{2,4,6}'::bigint[], '{2,4,6}'::bigint[]`},
		{"fail", s.fail, `2, 0, 'e', 'pending', 0, 'ch'`},
		{"startLeased", s.startLeased, `'{2,4,6}'::bigint[], 1000, 'w'`},
		{"extendLeases", s.extendLeases, `'{1,3,5}'::bigint[], 1000, 'w'`},
		{"succeedLeased", s.succeedLeased, `1, 1, 'w'`},
		{"failLeased", s.failLeased, `1, 1, 'e', 'pending', 0, 'ch', 'w'`},
	}
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`) // as a prepared statement runs after five executions
	require.NoError(t, err)
	// Closed, not returned to the shared pool: DEALLOCATE ALL would leave
	// pgx's statement cache naming statements the server no longer has
	// ("prepared statement ... does not exist" in whichever test got it next).
	defer func() { _ = conn.Conn().Close(ctx) }()
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
