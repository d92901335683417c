package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestUpIsConcurrentSafeAndIdempotent(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	all, err := migrations.All()
	require.NoError(t, err)
	require.NotEmpty(t, all)

	st, err := migrations.StatusOf(ctx, pool, schema)
	require.NoError(t, err)
	for _, s := range st {
		require.True(t, s.AppliedAt.IsZero(), "pending before Up")
	}

	// Eight processes' worth of Up at once: each migration applied exactly once.
	var wg sync.WaitGroup
	ran := make([][]int, 8)
	errs := make([]error, 8)
	for i := range 8 {
		wg.Go(func() { ran[i], errs[i] = migrations.Up(ctx, pool, schema) })
	}
	wg.Wait()
	total := 0
	for i := range 8 {
		require.NoError(t, errs[i])
		total += len(ran[i])
	}
	require.Equal(t, len(all), total, "every migration applied exactly once across callers")

	again, err := migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, again)

	st, err = migrations.StatusOf(ctx, pool, schema)
	require.NoError(t, err)
	require.Len(t, st, len(all))
	for _, s := range st {
		require.False(t, s.AppliedAt.IsZero(), "migration %d applied", s.Version)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.schema_migrations`).Scan(&n))
	require.Equal(t, len(all), n)
}

func TestBadSchemaNamesWriteNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for _, s := range []string{
		`x"; DROP SCHEMA public; --`, "Upper", "1abc", "a-b", "a b", "a\x00b", "ünï", strings.Repeat("a", 41), "semi;colon",
		// PostgreSQL's own: pg_* it refuses to create; information_schema
		// it creates, and pg_dump leaves out.
		"information_schema", "pg_catalog", "pg_toast", "pg_temp", "pg_foo", "pg_temp_1",
	} {
		_, err := migrations.Up(ctx, pool, s)
		require.ErrorIs(t, err, migrations.ErrInvalidSchema, "%q", s)
		_, err = migrations.StatusOf(ctx, pool, s)
		require.ErrorIs(t, err, migrations.ErrInvalidSchema, "%q", s)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname ILIKE '%drop%' OR nspname = 'Upper'`).Scan(&n))
	require.Zero(t, n)
}

func TestAllIsOrdered(t *testing.T) {
	all, err := migrations.All()
	require.NoError(t, err)
	for i, m := range all {
		if i > 0 {
			require.Greater(t, m.Version, all[i-1].Version, "versions increase")
		}
		require.NotEmpty(t, m.Name)
		require.Contains(t, m.SQL, "{{schema}}")
	}
}
