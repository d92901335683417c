package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// hostileOverloads are functions and operators in public that would be a
// better match than the built-in for a loosely typed call (an integer
// literal where the built-in takes bigint, bigint * interval, numeric *
// integer, text || bigint, a polymorphic function). Each records that it ran.
var hostileOverloads = []string{
	`CREATE FUNCTION public.hashtextextended(text, integer) RETURNS bigint LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('hashtextextended(text, integer)');
		SELECT pg_catalog.hashtextextended($1, $2::bigint) $$`,
	`CREATE FUNCTION public.evil_mul(bigint, interval) RETURNS interval LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('bigint * interval');
		SELECT $1::float8 OPERATOR(pg_catalog.*) $2 $$`,
	`CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.evil_mul)`,
	`CREATE FUNCTION public.evil_mul(integer, interval) RETURNS interval LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('integer * interval');
		SELECT $1::float8 OPERATOR(pg_catalog.*) $2 $$`,
	`CREATE OPERATOR public.* (LEFTARG = integer, RIGHTARG = interval, FUNCTION = public.evil_mul)`,
	`CREATE FUNCTION public.evil_mul(numeric, integer) RETURNS numeric LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('numeric * integer');
		SELECT $1 OPERATOR(pg_catalog.*) $2::numeric $$`,
	`CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.evil_mul)`,
	`CREATE FUNCTION public.evil_cat(text, bigint) RETURNS text LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('text || bigint');
		SELECT $1 OPERATOR(pg_catalog.||) $2::text $$`,
	`CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = bigint, FUNCTION = public.evil_cat)`,
	`CREATE FUNCTION public.jsonb_build_object(text, timestamptz) RETURNS jsonb LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('jsonb_build_object(text, timestamptz)');
		SELECT pg_catalog.jsonb_build_object($1, $2) $$`,
	`CREATE FUNCTION public.jsonb_build_object(text, text) RETURNS jsonb LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('jsonb_build_object(text, text)');
		SELECT pg_catalog.jsonb_build_object($1, $2) $$`,
	`CREATE FUNCTION public.unnest(bigint[]) RETURNS SETOF bigint LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('unnest(bigint[])');
		SELECT pg_catalog.unnest($1) $$`,
	`CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('unnest(text[])');
		SELECT pg_catalog.unnest($1) $$`,
	`CREATE FUNCTION public.unnest(integer[]) RETURNS SETOF integer LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('unnest(integer[])');
		SELECT pg_catalog.unnest($1) $$`,
	`CREATE FUNCTION public.unnest(jsonb[]) RETURNS SETOF jsonb LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('unnest(jsonb[])');
		SELECT pg_catalog.unnest($1) $$`,
	`CREATE FUNCTION public.format(text, integer) RETURNS text LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('format(text, integer)');
		SELECT pg_catalog.format($1, $2) $$`,
	`CREATE FUNCTION public.jsonb_typeof(json) RETURNS text LANGUAGE sql AS $$
		INSERT INTO public.pwned (what) VALUES ('jsonb_typeof(json)');
		SELECT pg_catalog.json_typeof($1) $$`,
}

// TestHostileSearchPathOverloadsNeverRun: with CREATE on public granted to
// PUBLIC (the default before PostgreSQL 15), a role defines overloads that
// would capture loosely typed calls. Migrate, enqueue (one job, many, with a
// delay, a unique key), a worker (claims, a failure and its retry, idle and
// its barrier), cancel, retry and retention, with a watcher of the events
// registered, never run any of them, and neither do the SQL API's functions
// (enqueue, enqueue_many, cancel, retry) called by a session whose
// search_path starts with public.
func TestHostileSearchPathOverloadsNeverRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := fmt.Sprintf("hostile_%08x", rand.Uint32())
	_, err := pgtest.Pool(t).Exec(ctx, `CREATE DATABASE `+db)
	require.NoError(t, err)
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	u.Path = "/" + db
	pool := pgtest.PoolOn(t, u.String(), func(c *pgxpool.Config) { c.MaxConns = 16 })
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pgtest.Pool(t).Exec(ctx, `DROP DATABASE IF EXISTS `+db+` WITH (FORCE)`)
	})
	_, err = pool.Exec(ctx, `GRANT CREATE ON SCHEMA public TO PUBLIC;
		CREATE TABLE public.pwned (what text NOT NULL, by_role text NOT NULL DEFAULT current_user);
		GRANT INSERT, SELECT ON public.pwned TO PUBLIC`)
	require.NoError(t, err)
	for _, sql := range hostileOverloads {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	pwned := func() []string {
		rows, err := pool.Query(ctx, `SELECT what || ' as ' || by_role FROM public.pwned`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	// The trap works: loosely typed calls do run the hostile code.
	_, err = pool.Exec(ctx, `SELECT 2::bigint * interval '1 second', hashtextextended('x', 0), 'a' || 1::bigint, format('%s', 1),
		(SELECT count(*) FROM unnest(ARRAY[1, 2]))`)
	require.NoError(t, err)
	require.Len(t, pwned(), 5)
	_, err = pool.Exec(ctx, `TRUNCATE public.pwned`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, pool, "")
	require.NoError(t, err)
	done := make(chan int64, 100)
	c, err := queue.New(pool, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		Backoff:      func(int) time.Duration { return 10 * time.Millisecond },
		PollInterval: 100 * time.Millisecond,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if j.Attempt == 1 && j.UniqueKey == "fail-once" {
				return fmt.Errorf("first attempt fails")
			}
			done <- j.ID
			return nil
		})},
	})
	require.NoError(t, err)
	stop := pgtest.RunInBackground(t, "hostile worker", c.Run)
	defer stop()
	// A dashboard watches: every commit below runs the NOTIFY trigger's
	// whole body (migration 0017).
	require.NoError(t, c.WatchEvents(ctx, "hostile"))
	time.Sleep(300 * time.Millisecond) // the worker marks itself idle and passes its barrier
	r1, err := c.Enqueue(ctx, queue.NewJob{Kind: "k", UniqueKey: "fail-once"})
	require.NoError(t, err)
	res, err := c.EnqueueMany(ctx, []queue.NewJob{{Kind: "k"}, {Kind: "k", Delay: 50 * time.Millisecond}, {Kind: "k", UniqueKey: "u2"}})
	require.NoError(t, err)
	want := map[int64]bool{r1.ID: true}
	for _, r := range res {
		want[r.ID] = true
	}
	deadline := time.After(30 * time.Second)
	for len(want) > 0 {
		select {
		case id := <-done:
			delete(want, id)
		case <-deadline:
			t.Fatalf("jobs not done: %v", want)
		}
	}
	// The SQL API, called as a user would, with loosely typed literals.
	var sqlID int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgwake.enqueue('k', '{"a": 1}', delay => '50 ms', unique_key => 'sql-1', priority => 1, max_attempts => 3)`).Scan(&sqlID))
	var sqlIDs []int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgwake.enqueue_many('[{"kind": "k", "delay": 0.05}, {"kind": "k", "run_after": "2030-01-01T00:00:00Z", "priority": 2, "unique_key": "sql-2"}]')`).Scan(&sqlIDs))
	require.Len(t, sqlIDs, 2)
	var cancelled bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgwake.cancel($1)`, sqlIDs[1]).Scan(&cancelled))
	require.True(t, cancelled)
	_, err = pool.Exec(ctx, `SELECT pgwake.enqueue('bad kind')`)
	require.Error(t, err)
	want = map[int64]bool{sqlID: true, sqlIDs[0]: true}
	deadline = time.After(30 * time.Second)
	for len(want) > 0 {
		select {
		case id := <-done:
			delete(want, id)
		case <-deadline:
			t.Fatalf("SQL API jobs not done: %v", want)
		}
	}
	_, err = pool.Exec(ctx, `UPDATE pgwake.jobs SET state = 'failed', finished_at = now() WHERE id = $1`, sqlID)
	require.NoError(t, err)
	var retried bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgwake.retry($1)`, sqlID).Scan(&retried))
	require.True(t, retried)
	select {
	case id := <-done:
		require.Equal(t, sqlID, id)
	case <-time.After(30 * time.Second):
		t.Fatal("retried job not run")
	}

	later, err := c.Enqueue(ctx, queue.NewJob{Kind: "k", Delay: time.Hour})
	require.NoError(t, err)
	require.NoError(t, c.Cancel(ctx, later.ID))
	_, err = c.DeleteFinished(ctx, queue.Retention{Succeeded: time.Nanosecond, Cancelled: time.Nanosecond, Failed: time.Nanosecond})
	require.NoError(t, err)
	_, err = migrations.Up(ctx, pool, "")
	require.NoError(t, err)
	require.Empty(t, pwned(), "hostile code ran")
}

// TestStrangersLocksBlockNothing: a role with no pgwake grants holds the
// advisory keys pgwake used to take (the queue's wake key, the migrate key),
// and a session holds the queue's real wake key exclusively. Enqueues and
// migrate finish at once, and an idle worker still wakes within a second
// (its poll is an hour).
func TestStrangersLocksBlockNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	ctx := context.Background()
	_, strangerURL := w.newRole("stranger", "")
	stranger := w.poolOn(strangerURL, "stranger", 2)
	conn, err := stranger.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0)), pg_advisory_lock(hashtextextended('pgwake.migrate.' || $2, 0))`,
		`"`+w.schema+`".default`, w.schema)
	require.NoError(t, err)
	// Even the real key, held exclusively (by a role that can read the salt).
	holder, err := w.admin.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock(`+w.table("wake_lock_key")+`('default'))`)
	require.NoError(t, err)
	defer func() { _, _ = holder.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`) }()

	got := make(chan time.Time, 1)
	c, err := queue.New(w.pool("stranger-test", 8), queue.Config{
		Schema:       w.schema,
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		PollInterval: time.Hour,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			got <- time.Now()
			return nil
		})},
	})
	require.NoError(t, err)
	stop := pgtest.RunInBackground(t, "worker", c.Run)
	defer stop()
	waitIdle := time.Now().Add(10 * time.Second)
	for {
		var n int
		require.NoError(t, w.admin.QueryRow(ctx, `SELECT count(*) FROM `+w.table("waiters")+` WHERE idle`).Scan(&n))
		if n > 0 || time.Now().After(waitIdle) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = c.Enqueue(ectx, queue.NewJob{Kind: "k"})
	require.NoError(t, err, "enqueue waited for a lock someone else held")
	enqueued := time.Now()
	select {
	case at := <-got:
		require.Less(t, at.Sub(enqueued), time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("the idle worker was not woken")
	}
	_, err = migrations.Up(ectx, w.admin, w.schema)
	require.NoError(t, err, "migrate waited for a lock someone else held")
}

// TestMigrateRefusesAForeignSchema: a role allowed to create schemas creates
// pgwake's schema first, with a schema_migrations table that claims every
// migration. migrate refuses it (the owner controls what runs there; trusted
// blindly, it would report the schema up to date with no tables) unless
// allowed explicitly; a schema the migrating role owns is migrated.
func TestMigrateRefusesAForeignSchema(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	ctx := context.Background()
	stranger, strangerURL := w.newRole("stranger", "")
	var db string
	require.NoError(t, w.admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db))
	_, err := w.admin.Exec(ctx, `GRANT CREATE ON DATABASE `+pgx.Identifier{db}.Sanitize()+` TO `+pgx.Identifier{stranger}.Sanitize())
	require.NoError(t, err)
	schema := fmt.Sprintf("foreign_%08x", rand.Uint32())
	t.Cleanup(func() { _, _ = w.admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	sp := w.poolOn(strangerURL, "stranger", 1)
	_, err = sp.Exec(ctx, `CREATE SCHEMA `+schema+`;
		CREATE TABLE `+schema+`.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO `+schema+`.schema_migrations (version, name) SELECT g, 'fake' FROM generate_series(1, 100) g`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, w.admin, schema)
	var fe *migrations.ForeignSchemaError
	require.ErrorAs(t, err, &fe)
	require.ErrorIs(t, err, migrations.ErrForeignSchema)
	require.Equal(t, stranger, fe.Owner)
	require.Contains(t, err.Error(), "--allow-foreign-schema")
	// Allowed explicitly, the fake table is trusted: that is the risk.
	ran, err := migrations.UpWithOptions(ctx, w.admin, schema, migrations.Options{AllowForeignSchema: true})
	require.NoError(t, err)
	require.Empty(t, ran)

	// The stranger's own schema table inside a schema the migrator owns.
	own := fmt.Sprintf("owned_%08x", rand.Uint32())
	t.Cleanup(func() { _, _ = w.admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+own+` CASCADE`) })
	_, err = w.admin.Exec(ctx, `CREATE SCHEMA `+own+`; GRANT USAGE, CREATE ON SCHEMA `+own+` TO `+pgx.Identifier{stranger}.Sanitize())
	require.NoError(t, err)
	_, err = sp.Exec(ctx, `CREATE TABLE `+own+`.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, w.admin, own)
	require.ErrorAs(t, err, &fe)
	require.Contains(t, fe.Object, "schema_migrations")
}
