package events_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgcluster"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
)

func TestBadSlotNamesAreRejected(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ps := events.NewGoChannel(nil)
	defer ps.Close()
	for _, name := range []string{"Bad-Name", "1slot", "slot; DROP TABLE x", strings.Repeat("s", 64), "émoji"} {
		_, err := events.New(pool, events.Config{Slot: name, Publisher: ps})
		require.ErrorIs(t, err, events.ErrInvalidSlotName, name)
		require.ErrorIs(t, events.DropSlot(context.Background(), pool, name, false), events.ErrInvalidSlotName)
	}
	_, err := events.New(pool, events.Config{})
	require.ErrorIs(t, err, events.ErrInvalidConfig)
	require.Contains(t, err.Error(), "Publisher is nil")
	_, err = events.New(pool, events.Config{Schema: "Bad Schema", Publisher: ps})
	require.Error(t, err)
	require.ErrorIs(t, events.DropSlot(context.Background(), pool, "no_such_slot_here", false), events.ErrSlotNotFound)
}

func TestWalLevelNotLogicalSaysHowToFix(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{ExtraConf: map[string]string{"wal_level": "replica"}})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Stop()) }()
	pool, err := pgxpool.New(ctx, c.URL)
	require.NoError(t, err)
	defer pool.Close()
	ps := events.NewGoChannel(nil)
	defer ps.Close()
	s, err := events.New(pool, events.Config{Publisher: ps})
	require.NoError(t, err)
	err = s.Run(ctx)
	require.ErrorIs(t, err, events.ErrWalLevel)
	require.Contains(t, err.Error(), "wal_level = replica")
	require.Contains(t, err.Error(), "ALTER SYSTEM SET wal_level = logical")
}

// role creates a login role for the test, dropped at cleanup.
func role(t *testing.T, e *env, attrs string) *pgxpool.Pool {
	name := e.Schema + "_r"
	ctx := context.Background()
	_, err := e.Pool.Exec(ctx, `CREATE ROLE `+sqlident.Quote(name)+` LOGIN PASSWORD 'rolepw' `+attrs)
	require.NoError(t, err)
	_, err = e.Pool.Exec(ctx, `GRANT USAGE ON SCHEMA `+sqlident.Quote(e.Schema)+` TO `+sqlident.Quote(name))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = e.Pool.Exec(context.Background(), `DROP OWNED BY `+sqlident.Quote(name))
		_, _ = e.Pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+sqlident.Quote(name))
	})
	return pgtest.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.User, c.ConnConfig.Password = name, "rolepw" })
}

func TestMissingReplicationPrivilege(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := role(t, e, "NOREPLICATION")
	ps := events.NewGoChannel(nil)
	defer ps.Close()
	s, err := events.New(pool, e.Config(ps))
	require.NoError(t, err)
	err = s.Run(context.Background())
	require.ErrorIs(t, err, events.ErrNoReplicationPrivilege)
	require.Contains(t, err.Error(), "ALTER ROLE")
}

func TestPublicationNeedsTableOwner(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := role(t, e, "REPLICATION")
	ps := events.NewGoChannel(nil)
	defer ps.Close()
	s, err := events.New(pool, e.Config(ps))
	require.NoError(t, err)
	err = s.Run(context.Background())
	require.ErrorIs(t, err, events.ErrPublication)
	require.Contains(t, err.Error(), "CREATE PUBLICATION "+sqlident.Quote(e.Pub))
}

func TestSlotOfAnotherPluginIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := e.Pool.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, e.Slot)
	require.NoError(t, err)
	ps := events.NewGoChannel(nil)
	defer ps.Close()
	s, err := events.New(e.Pool, e.Config(ps))
	require.NoError(t, err)
	err = s.Run(context.Background())
	require.ErrorIs(t, err, events.ErrSlot)
	require.Contains(t, err.Error(), "test_decoding")
}

func TestSubjectSafe(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"emails": "emails", "billing.eu": "billing.eu", "a-b_c9": "a-b_c9",
		"a..b": "a%2E%2Eb", "a.": "a%2E", ".a": "%2Ea", "": "%00",
		"a b": "a%20b", "*": "%2A", ">": "%3E", "a%2E": "a%252E", "é": "%C3%A9",
	} {
		require.Equal(t, want, events.SubjectSafe(in), "SubjectSafe(%q)", in)
	}
	require.Equal(t, "pgwake.events.a%2E%2Eb", events.TopicPerQueue("pgwake.events")(events.Event{Queue: "a..b"}))
}

// A stream made again for its slot on its registry (after Run returned a
// permanent error, say) shares the metrics already registered: New
// refused it with a duplicate registration.
func TestStreamMadeAgainOnItsRegistry(t *testing.T) {
	pool := pgtest.Pool(t)
	reg := prometheus.NewRegistry()
	ps := events.NewGoChannel(nil)
	defer ps.Close()
	cfg := events.Config{Schema: "made_again", Publisher: ps, Registerer: reg}
	_, err := events.New(pool, cfg)
	require.NoError(t, err)
	_, err = events.New(pool, cfg)
	require.NoError(t, err, "a stream made again on its registry")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.NotEmpty(t, mfs)
	cfg.Slot = "made_again_other"
	_, err = events.New(pool, cfg)
	require.NoError(t, err, "another slot on the same registry")
}
