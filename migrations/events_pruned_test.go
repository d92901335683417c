package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// Migration 0025's events_pruned goes to the roles granted on events before
// it: a role that may delete events (events prune) may write it, a role
// that may read them (the dashboard) may read it, any other role nothing.
// Without it an upgraded deployment's prune, run as the operator role of
// docs/grants.sql, failed on the new table.
func TestEventsPrunedKeepsEventGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := schemaBefore0025(t)
	pruner, reader, other := schema+"_pruner", schema+"_reader", schema+"_other"
	columns := schema + "_columns" // a reader granted the columns it reads
	tempRoles(t, pool, pruner, reader, other, columns)
	events := sqlident.Quote(schema, "events")
	_, err := pool.Exec(ctx, `GRANT SELECT, DELETE ON `+events+` TO `+sqlident.Quote(pruner)+`;
		GRANT SELECT ON `+events+` TO `+sqlident.Quote(reader)+`;
		GRANT SELECT (id, job_id, type, queue, kind, attempt, at, data) ON `+events+` TO `+sqlident.Quote(columns))
	require.NoError(t, err)

	_, err = migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	for role, want := range map[string][3]bool{
		pruner:  {true, true, true},
		reader:  {true, false, false},
		columns: {true, false, false},
		other:   {false, false, false},
	} {
		require.Equal(t, want, prunedPrivileges(t, pool, schema, role), role)
	}
}

// A grant on events to PUBLIC carries over as one to PUBLIC: every role
// could delete events (events prune) before migration 0025, and still may
// prune after it; it was left out, and such a prune failed on the new table.
func TestEventsPrunedKeepsPublicEventGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := schemaBefore0025(t)
	_, err := pool.Exec(ctx, `GRANT SELECT, DELETE ON `+sqlident.Quote(schema, "events")+` TO PUBLIC`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, [3]bool{true, true, true}, prunedPrivileges(t, pool, schema, "public"), "PUBLIC")
}

// A role that owns events but did not run migration 0025 (the tables handed
// to the application's role, migrations run by another) may delete events
// as their owner, and may record how far it did: events_pruned, owned by
// the role that ran the migration, granted it nothing.
func TestEventsPrunedKeepsTheEventsOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := schemaBefore0025(t)
	owner := schema + "_owner"
	tempRoles(t, pool, owner)
	_, err := pool.Exec(ctx, `ALTER TABLE `+sqlident.Quote(schema, "events")+` OWNER TO `+sqlident.Quote(owner))
	require.NoError(t, err)

	_, err = migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, [3]bool{true, true, true}, prunedPrivileges(t, pool, schema, owner), "the owner of events")
}

// schemaBefore0025 is a fresh schema migrated up to 0024.
func schemaBefore0025(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	_, err := migrations.UpTo(context.Background(), pool, schema, 24)
	require.NoError(t, err)
	return pool, schema
}

// tempRoles creates roles that the test's cleanup drops.
func tempRoles(t *testing.T, pool *pgxpool.Pool, roles ...string) {
	t.Helper()
	for _, r := range roles {
		_, err := pool.Exec(context.Background(), `CREATE ROLE `+sqlident.Quote(r)+` NOLOGIN`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+sqlident.Quote(r))
			_, _ = pool.Exec(context.Background(), `DROP ROLE `+sqlident.Quote(r))
		})
	}
}

// prunedPrivileges is whether role has SELECT, INSERT and UPDATE on the
// schema's events_pruned.
func prunedPrivileges(t *testing.T, pool *pgxpool.Pool, schema, role string) (has [3]bool) {
	t.Helper()
	for i, priv := range []string{"SELECT", "INSERT", "UPDATE"} {
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT has_table_privilege($1, $2, $3)`,
			role, schema+".events_pruned", priv).Scan(&has[i]))
	}
	return has
}
