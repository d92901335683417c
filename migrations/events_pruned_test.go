package migrations_test

import (
	"context"
	"testing"

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
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := migrations.UpTo(ctx, pool, schema, 24)
	require.NoError(t, err)
	pruner, reader, other := schema+"_pruner", schema+"_reader", schema+"_other"
	columns := schema + "_columns" // a reader granted the columns it reads
	for _, r := range []string{pruner, reader, other, columns} {
		_, err := pool.Exec(ctx, `CREATE ROLE `+sqlident.Quote(r)+` NOLOGIN`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+sqlident.Quote(r))
			_, _ = pool.Exec(context.Background(), `DROP ROLE `+sqlident.Quote(r))
		})
	}
	events := sqlident.Quote(schema, "events")
	_, err = pool.Exec(ctx, `GRANT SELECT, DELETE ON `+events+` TO `+sqlident.Quote(pruner)+`;
		GRANT SELECT ON `+events+` TO `+sqlident.Quote(reader)+`;
		GRANT SELECT (id, job_id, type, queue, kind, attempt, at, data) ON `+events+` TO `+sqlident.Quote(columns))
	require.NoError(t, err)

	_, err = migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	table := schema + ".events_pruned"
	for role, want := range map[string][3]bool{
		pruner:  {true, true, true},
		reader:  {true, false, false},
		columns: {true, false, false},
		other:   {false, false, false},
	} {
		for i, priv := range []string{"SELECT", "INSERT", "UPDATE"} {
			var has bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2, $3)`, role, table, priv).Scan(&has))
			require.Equal(t, want[i], has, "%s %s", role, priv)
		}
	}
}

// A grant on events to PUBLIC carries over as one to PUBLIC: every role
// could delete events (events prune) before migration 0025, and still may
// prune after it; it was left out, and such a prune failed on the new table.
func TestEventsPrunedKeepsPublicEventGrants(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := migrations.UpTo(ctx, pool, schema, 24)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `GRANT SELECT, DELETE ON `+sqlident.Quote(schema, "events")+` TO PUBLIC`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	for _, priv := range []string{"SELECT", "INSERT", "UPDATE"} {
		var has bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT has_table_privilege('public', $1, $2)`, schema+".events_pruned", priv).Scan(&has))
		require.True(t, has, "PUBLIC %s", priv)
	}
}

// A role that owns events but did not run migration 0025 (the tables handed
// to the application's role, migrations run by another) may delete events
// as their owner, and may record how far it did: events_pruned, owned by
// the role that ran the migration, granted it nothing.
func TestEventsPrunedKeepsTheEventsOwner(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := migrations.UpTo(ctx, pool, schema, 24)
	require.NoError(t, err)
	owner := schema + "_owner"
	_, err = pool.Exec(ctx, `CREATE ROLE `+sqlident.Quote(owner)+` NOLOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+sqlident.Quote(owner))
		_, _ = pool.Exec(context.Background(), `DROP ROLE `+sqlident.Quote(owner))
	})
	_, err = pool.Exec(ctx, `ALTER TABLE `+sqlident.Quote(schema, "events")+` OWNER TO `+sqlident.Quote(owner))
	require.NoError(t, err)

	_, err = migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	for _, priv := range []string{"SELECT", "INSERT", "UPDATE"} {
		var has bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2, $3)`, owner, schema+".events_pruned", priv).Scan(&has))
		require.True(t, has, "the owner of events: %s", priv)
	}
}
