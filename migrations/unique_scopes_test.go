package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// Migration 0014 recreates the enqueue functions with new parameters; the
// EXECUTE grants the old ones had move to the new ones, and no other role
// gains any. Migration 0021's enqueue_one goes to the same roles.
func TestUniqueScopesKeepsEnqueueGrants(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := migrations.UpTo(ctx, pool, schema, 13)
	require.NoError(t, err)
	granted, other := schema+"_prod", schema+"_other"
	for _, r := range []string{granted, other} {
		_, err := pool.Exec(ctx, `CREATE ROLE `+sqlident.Quote(r)+` NOLOGIN`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+sqlident.Quote(r))
			_, _ = pool.Exec(context.Background(), `DROP ROLE `+sqlident.Quote(r))
		})
	}
	q := sqlident.Quote(schema)
	_, err = pool.Exec(ctx, fmt.Sprintf(`GRANT EXECUTE ON FUNCTION %s.enqueue(text, jsonb, text, timestamptz, interval, integer, integer, text),
		%s.enqueue_many(jsonb),
		%s.enqueue_jobs(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer) TO %s`, q, q, q, sqlident.Quote(granted)))
	require.NoError(t, err)

	_, err = migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	for fn, sig := range map[string]string{
		"enqueue":      "(text, jsonb, text, timestamptz, interval, integer, integer, text, text, text, interval, jsonb)",
		"enqueue_many": "(jsonb)",
		"enqueue_jobs": "(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer, text[], text[], interval[], jsonb[])",
		"enqueue_one":  "(text, jsonb, text, timestamptz, interval, integer, integer, jsonb, integer)",
	} {
		for role, want := range map[string]bool{granted: true, other: false} {
			var has bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT has_function_privilege($1, $2, 'EXECUTE')`, role, schema+"."+fn+sig).Scan(&has))
			require.Equal(t, want, has, "%s on %s", role, fn)
		}
	}
}
