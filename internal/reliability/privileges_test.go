package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// grantsFile is the documented least-privilege grants.
const grantsFile = "../../docs/grants.sql"

// newRole creates a login role (with attrs, e.g. "REPLICATION") and a
// password, dropped at cleanup, and returns its name and a URL for it.
func (w *world) newRole(prefix, attrs string) (string, string) {
	w.t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("%s_%08x", prefix, rand.Uint32())
	pass := fmt.Sprintf("pw%016x", rand.Uint64())
	_, err := w.admin.Exec(ctx, `CREATE ROLE `+sqlident.Quote(name)+` LOGIN `+attrs+` PASSWORD '`+pass+`'`)
	require.NoError(w.t, err)
	w.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = w.admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name)
		_, _ = w.admin.Exec(ctx, `DROP OWNED BY `+sqlident.Quote(name))
		_, _ = w.admin.Exec(ctx, `DROP ROLE `+sqlident.Quote(name))
	})
	u, err := url.Parse(w.url)
	require.NoError(w.t, err)
	u.User = url.UserPassword(name, pass)
	return name, u.String()
}

// applyGrants runs docs/grants.sql for the schema and roles (one role may
// take several parts).
func (w *world) applyGrants(producer, worker, operator, stream, sqlProducer string) {
	w.t.Helper()
	b, err := os.ReadFile(grantsFile)
	require.NoError(w.t, err)
	sql := strings.NewReplacer("{{schema}}", sqlident.Quote(w.schema),
		"{{producer_role}}", sqlident.Quote(producer), "{{worker_role}}", sqlident.Quote(worker),
		"{{operator_role}}", sqlident.Quote(operator), "{{stream_role}}", sqlident.Quote(stream),
		"{{sql_producer_role}}", sqlident.Quote(sqlProducer)).Replace(string(b))
	require.NotContains(w.t, sql, "{{", "a placeholder of docs/grants.sql the test does not know")
	_, err = w.admin.Exec(context.Background(), sql)
	require.NoError(w.t, err)
}

func requireDenied(t *testing.T, err error, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: want permission denied, got %v", what, err)
	require.Equal(t, "42501", pgErr.Code, "%s: %v", what, err) // insufficient_privilege
}

// TestLeastPrivilegeQueue runs producers, workers and operators as three
// roles that have only their parts of docs/grants.sql: enqueue (single,
// batch, in a transaction, unique keys) as the producer, work with retries
// and failures and retention as the worker, cancel, retry and the read API
// (JobGet, JobList) as the operator, all succeed; DDL of every kind is refused to each.
func TestLeastPrivilegeQueue(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	ctx := context.Background()
	producer, producerURL := w.newRole("pgwake_producer", "")
	worker, workerURL := w.newRole("pgwake_worker", "")
	operator, operatorURL := w.newRole("pgwake_operator", "")
	w.applyGrants(producer, worker, operator, operator, producer)
	// The application's own table, written by the handler.
	_, err := w.admin.Exec(ctx, `GRANT INSERT ON `+w.table(effectsTable)+` TO `+sqlident.Quote(worker))
	require.NoError(t, err)

	pool := w.poolOn(workerURL, appWorker, 10)
	producerPool := w.poolOn(producerURL, appProducer, 4)
	operatorPool := w.poolOn(operatorURL, "pgwake_operator", 2)
	for _, p := range []*pgxpool.Pool{pool, producerPool, operatorPool} {
		var super bool
		require.NoError(t, p.QueryRow(ctx, `SELECT rolsuper OR rolcreatedb OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&super))
		require.False(t, super)
	}

	// A dashboard watches (the operator registers it): every role's
	// commits that write events run the NOTIFY trigger (migration 0017, as
	// the schema's owner).
	watcher, err := queue.New(operatorPool, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	require.NoError(t, watcher.WatchEvents(ctx, "least-privilege"))
	listen, err := w.admin.Acquire(ctx)
	require.NoError(t, err)
	defer listen.Release()
	_, err = listen.Exec(ctx, `LISTEN `+pgx.Identifier{queue.EventsChannel(w.schema)}.Sanitize())
	require.NoError(t, err)

	cfg := workerConfig(w.schema, 200*time.Millisecond, 0)
	c, err := queue.New(pool, cfg)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	prod, err := queue.New(producerPool, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	const n = 200
	var jobs []queue.NewJob
	for i := range n {
		jobs = append(jobs, newJob(i))
	}
	_, err = prod.EnqueueMany(ctx, jobs[:100])
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, producerPool, func(tx pgx.Tx) error {
		_, err := prod.EnqueueManyTx(ctx, tx, jobs[100:199])
		return err
	}))
	_, err = prod.Enqueue(ctx, jobs[199])
	require.NoError(t, err)
	w.waitAllFinal(n, 2*time.Minute)
	w.check(t.Name(), n, true, 0, nil, "roles producer, worker, operator (docs/grants.sql)")
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = listen.Conn().WaitForNotification(wctx)
	wcancel()
	require.NoError(t, err, "the watcher was notified")

	// A unique key held: the producer learns the holder's id.
	first, err := prod.Enqueue(ctx, queue.NewJob{Kind: jobKind, UniqueKey: "once", Delay: time.Hour, Payload: map[string]any{"mode": modeOK}})
	require.NoError(t, err)
	again, err := prod.Enqueue(ctx, queue.NewJob{Kind: jobKind, UniqueKey: "once", Delay: time.Hour, Payload: map[string]any{"mode": modeOK}})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.ID, again.ID)

	// Operator actions: retry a failed job, cancel one.
	op, err := queue.New(operatorPool, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	var failed int64
	require.NoError(t, w.admin.QueryRow(ctx, `SELECT id FROM `+w.table("jobs")+` WHERE state = 'failed' LIMIT 1`).Scan(&failed))
	require.NoError(t, op.Retry(ctx, failed))
	require.NoError(t, op.Cancel(ctx, first.ID))
	// The operator reads jobs (jobs list/show, the UI), a period's end too.
	period, err := prod.Enqueue(ctx, queue.NewJob{Kind: jobKind, UniqueKey: "daily", UniquePeriod: time.Hour, Delay: time.Hour, Payload: map[string]any{"mode": modeOK}})
	require.NoError(t, err)
	read, err := op.JobGet(ctx, period.ID)
	require.NoError(t, err)
	require.NotNil(t, read.HeldUntil)
	_, err = op.JobList(ctx, queue.JobListParams{})
	require.NoError(t, err)
	deadline := time.Now().Add(time.Minute)
	for w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE id = $1 AND state = 'failed' AND attempts = 3`, failed) == 0 {
		require.True(t, time.Now().Before(deadline), "retried job did not run again")
		time.Sleep(20 * time.Millisecond)
	}

	// Retention, as the workers run it: finished jobs that expired go.
	_, err = w.admin.Exec(ctx, `UPDATE `+w.table("jobs")+` SET finished_at = now() - interval '2 days' WHERE state = 'succeeded'`)
	require.NoError(t, err)
	succeeded := w.count(`SELECT count(*) FROM ` + w.table("jobs") + ` WHERE state = 'succeeded'`)
	require.Positive(t, succeeded)
	deleted, err := c.DeleteFinished(ctx, queue.Retention{})
	require.NoError(t, err)
	require.Equal(t, map[queue.JobState]int64{queue.StateSucceeded: int64(succeeded)}, deleted)
	// The operator prunes too (jobs prune, events prune).
	_, err = op.DeleteFinished(ctx, queue.Retention{Cancelled: time.Nanosecond})
	require.NoError(t, err)
	pruned, err := events.DeleteBefore(ctx, operatorPool, w.schema, time.Now(), 0)
	require.NoError(t, err)
	require.Positive(t, pruned, "the deleted jobs' events")
	through, err := op.EventsPrunedThrough(ctx) // the dashboard reads it
	require.NoError(t, err)
	require.Positive(t, through)
	_, err = events.Verify(ctx, operatorPool, w.schema)
	require.NoError(t, err)

	// No DDL, no owner-only operations, no migrations, for any of them.
	for _, p := range []*pgxpool.Pool{pool, producerPool, operatorPool} {
		for _, ddl := range []string{
			`CREATE TABLE ` + w.table("x") + ` (a int)`,
			`DROP TABLE ` + w.table("jobs"),
			`ALTER TABLE ` + w.table("jobs") + ` ADD COLUMN x int`,
			`TRUNCATE ` + w.table("jobs"),
			`UPDATE ` + w.table("events") + ` SET type = 'x'`,
			`CREATE INDEX ON ` + w.table("jobs") + ` (kind)`,
			`CREATE SCHEMA evil`,
			`CREATE TABLE public.evil (a int)`,
			`CREATE FUNCTION ` + w.table("evil") + `() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
			`DROP FUNCTION ` + w.table("wake_needed") + `(text)`,
			`CREATE PUBLICATION evil FOR TABLE ` + w.table("events"),
		} {
			_, err := p.Exec(ctx, ddl)
			requireDenied(t, err, ddl)
		}
		_, err = migrations.Up(ctx, p, w.schema+"_other")
		require.Error(t, err, "migrations as a pgwake role")
	}
}

// TestLeastPrivilegeProducer enqueues as a role that has only the
// producer grants of docs/grants.sql (USAGE on the schema, EXECUTE on the
// SQL API's enqueue functions): SQL enqueue and enqueue_many, and the Go
// client (which calls the same function), work, in a transaction too; a
// worker runs the jobs; every table, the sequence, cancel and retry are
// refused.
func TestLeastPrivilegeProducer(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	ctx := context.Background()
	app, _ := w.newRole("pgwake_app", "")
	producer, producerURL := w.newRole("pgwake_producer", "")
	w.applyGrants(app, app, app, app, producer)
	pool := w.poolOn(producerURL, "pgwake_producer", 4)
	fn := func(name string) string { return w.table(name) }

	var id int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT `+fn("enqueue")+`($1, $2::jsonb, queue => 'default')`, jobKind, `{"mode": "ok"}`).Scan(&id))
	var ids []int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT `+fn("enqueue_many")+`($1::jsonb)`,
		`[{"kind": "`+jobKind+`", "payload": {"mode": "ok"}}, {"kind": "`+jobKind+`", "payload": {"mode": "ok"}, "unique_key": "p1"}]`).Scan(&ids))
	require.Len(t, ids, 2)
	c, err := queue.New(pool, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := c.EnqueueTx(ctx, tx, queue.NewJob{Kind: jobKind, Payload: map[string]any{"mode": modeOK}, UniqueKey: "p2"})
		return err
	}))
	dup, err := c.Enqueue(ctx, queue.NewJob{Kind: jobKind, UniqueKey: "p1"})
	require.NoError(t, err)
	require.Equal(t, queue.EnqueueResult{ID: ids[1], Duplicate: true}, dup)
	require.Equal(t, 4, w.count(`SELECT count(*) FROM `+w.table("events")+` WHERE type = 'enqueued'`))

	for _, sql := range []string{
		`SELECT count(*) FROM ` + w.table("jobs"),
		`INSERT INTO ` + w.table("jobs") + ` (queue, kind) VALUES ('default', 'k')`,
		`UPDATE ` + w.table("jobs") + ` SET priority = 1`,
		`INSERT INTO ` + w.table("events") + ` (job_id, type, queue, kind, attempt) VALUES (1, 'x', 'q', 'k', 0)`,
		`SELECT count(*) FROM ` + w.table("waiters"),
		`SELECT salt FROM ` + w.table("wake_salt"),
		`SELECT nextval('` + w.table("jobs_id_seq") + `')`,
		`SELECT ` + fn("cancel") + `(1)`,
		`SELECT ` + fn("cancel_jobs") + `(ARRAY[1::bigint])`,
		`SELECT ` + fn("retry") + `(1)`,
		`SELECT ` + fn("wake_lock_key") + `('default')`,
	} {
		_, err := pool.Exec(ctx, sql)
		requireDenied(t, err, sql)
	}

	worker, err := queue.New(w.pool("pgwake_worker", 10), workerConfig(w.schema, 200*time.Millisecond, 0))
	require.NoError(t, err)
	stop := pgtest.RunInBackground(t, "worker", worker.Run)
	defer stop()
	w.waitAllFinal(4, time.Minute)
	require.Equal(t, 4, w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE state = 'succeeded'`))
}

// TestLeastPrivilegeEventStream streams the event log as a role with
// REPLICATION and the stream grants of docs/grants.sql only; the
// publication was created by the owner.
func TestLeastPrivilegeEventStream(t *testing.T) {
	t.Parallel()
	// Our own cluster (wal_level=logical), even when $TEST_DATABASE_URL
	// points at a server that may not have it.
	w := newWorld(t, true)
	ctx := context.Background()
	var level string
	require.NoError(t, w.admin.QueryRow(ctx, `SHOW wal_level`).Scan(&level))
	require.Equal(t, "logical", level)
	app, appURL := w.newRole("pgwake_app", "")
	stream, streamURL := w.newRole("pgwake_stream", "REPLICATION")
	w.applyGrants(app, app, app, stream, app)
	pubName, slot := w.schema+"_pub", w.schema+"_slot"
	require.NoError(t, events.EnsurePublication(ctx, w.admin, w.schema, pubName))
	t.Cleanup(func() {
		_ = events.DropSlot(context.Background(), w.admin, slot, true)
		_ = events.DropPublication(context.Background(), w.admin, pubName)
	})

	gc := events.NewGoChannel(watermill.NopLogger{})
	msgs, err := gc.Subscribe(ctx, "pgwake.events")
	require.NoError(t, err)
	streamPool := w.poolOn(streamURL, "pgwake_stream", 4)
	s, err := events.New(streamPool, events.Config{Schema: w.schema, Slot: slot, Publication: pubName, Publisher: gc,
		StatusInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(time.Minute)
	for s.Sessions() == 0 {
		require.True(t, time.Now().Before(deadline), "the stream did not start as the replication role")
		time.Sleep(20 * time.Millisecond)
	}

	c, err := queue.New(w.poolOn(appURL, appProducer, 4), queue.Config{Schema: w.schema})
	require.NoError(t, err)
	r, err := c.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	select {
	case m := <-msgs:
		e, err := events.Decode(m.Payload)
		require.NoError(t, err)
		require.Equal(t, r.ID, e.JobID)
		require.Equal(t, queue.EventEnqueued, e.Type)
		m.Ack()
	case <-time.After(time.Minute):
		t.Fatal("no event streamed")
	}
	// The stream role cannot write pgwake's tables or create publications.
	_, err = streamPool.Exec(ctx, `INSERT INTO `+w.table("events")+` (job_id, type, queue, kind, attempt) VALUES (1, 'x', 'q', 'k', 0)`)
	requireDenied(t, err, "stream role inserting events")
	_, err = streamPool.Exec(ctx, `CREATE PUBLICATION evil FOR TABLE `+w.table("events"))
	requireDenied(t, err, "stream role creating a publication")
	_, err = streamPool.Exec(ctx, `SELECT payload FROM `+w.table("jobs"))
	requireDenied(t, err, "stream role reading jobs")

	// The truth about REPLICATION (docs/security.md): through a slot of its
	// own with another output plugin, the stream role reads every row change
	// of the database, of tables it has no grant on too; and it drops a
	// slot it did not create.
	_, err = w.admin.Exec(ctx, `CREATE TABLE `+w.table("users")+` (name text, password_hash text)`)
	require.NoError(t, err)
	conn, err := streamPool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SELECT * FROM `+w.table("users"))
	requireDenied(t, err, "stream role reading an unrelated table")
	spy := w.schema + "_spy"
	_, err = conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding', true)`, spy)
	require.NoError(t, err, "a REPLICATION role creates a slot with any plugin")
	_, err = w.admin.Exec(ctx, `INSERT INTO `+w.table("users")+` VALUES ('alice', 'hash-0f-alice')`)
	require.NoError(t, err)
	var changes string
	require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(string_agg(data, E'\n'), '') FROM pg_logical_slot_get_changes($1, NULL, NULL)`, spy).Scan(&changes))
	require.Contains(t, changes, "hash-0f-alice", "REPLICATION reads tables without a grant")
	other := w.schema + "_other"
	_, err = w.admin.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, other)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, other)
	require.NoError(t, err, "a REPLICATION role drops another system's slot")
}

// TestRolesHoldOnlyWhatTheyNeed: each role of docs/grants.sql is refused
// what it does not need (SQLSTATE 42501), and no role can write a row a
// worker cannot finish (the constraints of migration 0009, SQLSTATE 23514).
func TestRolesHoldOnlyWhatTheyNeed(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	ctx := context.Background()
	producer, producerURL := w.newRole("pgwake_producer", "")
	worker, workerURL := w.newRole("pgwake_worker", "")
	operator, operatorURL := w.newRole("pgwake_operator", "")
	stream, _ := w.newRole("pgwake_stream", "")
	w.applyGrants(producer, worker, operator, stream, producer)
	producerPool := w.poolOn(producerURL, appProducer, 2)
	workerPool := w.poolOn(workerURL, appWorker, 2)
	operatorPool := w.poolOn(operatorURL, "pgwake_operator", 2)
	jobs, events, waiters, attempts := w.table("jobs"), w.table("events"), w.table("waiters"), w.table("attempts")

	prod, err := queue.New(producerPool, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	mine, err := prod.Enqueue(ctx, queue.NewJob{Kind: "k", Delay: time.Hour, Payload: map[string]any{"card": "4111"}})
	require.NoError(t, err)
	denied := func(p *pgxpool.Pool, who string, stmts ...string) {
		t.Helper()
		for _, sql := range stmts {
			_, err := p.Exec(ctx, sql)
			requireDenied(t, err, who+": "+sql)
		}
	}
	denied(producerPool, "producer",
		`SELECT payload FROM `+jobs, `SELECT last_error FROM `+jobs, `SELECT * FROM `+jobs,
		`UPDATE `+jobs+` SET state = 'cancelled'`, `DELETE FROM `+jobs,
		`INSERT INTO `+jobs+` (queue, kind, state) VALUES ('default', 'k', 'succeeded')`,
		`INSERT INTO `+jobs+` (queue, kind, attempts) VALUES ('default', 'k', 4)`,
		`INSERT INTO `+waiters+` (queue, client_id) VALUES ('default', 'x')`,
		`UPDATE `+waiters+` SET idle = false`, `DELETE FROM `+waiters,
		`SELECT * FROM `+events, `DELETE FROM `+events, `UPDATE `+events+` SET type = 'x'`,
		`SELECT * FROM `+attempts, `DELETE FROM `+attempts,
	)
	err = prod.Cancel(ctx, mine.ID)
	requireDenied(t, err, "producer cancelling a job")
	err = prod.Retry(ctx, mine.ID)
	requireDenied(t, err, "producer retrying a job")
	_, err = prod.DeleteFinished(ctx, queue.Retention{Succeeded: time.Nanosecond})
	requireDenied(t, err, "producer deleting jobs")
	// The producer's gap until enqueue goes through a SECURITY DEFINER
	// function: it inserts rows into events (see docs/security.md).
	_, err = producerPool.Exec(ctx, `INSERT INTO `+events+` (job_id, type, queue, kind, attempt) VALUES ($1, 'succeeded', 'default', 'k', 1)`, mine.ID)
	require.NoError(t, err, "documented gap: producers can insert event rows")

	denied(workerPool, "worker",
		`UPDATE `+jobs+` SET payload = '{}'`, `UPDATE `+jobs+` SET max_attempts = 100`, `UPDATE `+jobs+` SET kind = 'x'`,
		`INSERT INTO `+jobs+` (queue, kind, state) VALUES ('default', 'k', 'succeeded')`,
		`SELECT * FROM `+events, `DELETE FROM `+events, `UPDATE `+events+` SET type = 'x'`,
	)
	// No role can silence the live feed's notifications (migration 0017's
	// stamp), or read when the last one was sent.
	stamp := w.table("event_notify_stamp")
	for _, p := range []*pgxpool.Pool{producerPool, workerPool, operatorPool} {
		denied(p, "any role", `SELECT pg_catalog.setval('`+stamp+`', 0)`, `SELECT last_value FROM `+stamp)
	}
	// Writing events needs nothing on the watchers (the trigger runs as the
	// owner): producers and workers cannot read them.
	for _, p := range []*pgxpool.Pool{producerPool, workerPool} {
		denied(p, "producer or worker", `SELECT * FROM `+w.table("event_watchers"))
	}
	denied(operatorPool, "operator",
		`INSERT INTO `+jobs+` (queue, kind) VALUES ('default', 'k')`, `UPDATE `+jobs+` SET payload = '{}'`,
		`UPDATE `+jobs+` SET attempts = 0`,
		`SELECT * FROM `+waiters, `DELETE FROM `+waiters, `INSERT INTO `+attempts+` (job_id, queue, attempt, batch, client_id) VALUES (1, 'q', 1, 1, 'x')`,
	)

	// Rows a worker could not finish, written with the grants a role has.
	var checkViolation = func(err error, what string) {
		t.Helper()
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", what, err)
		require.Equal(t, "23514", pgErr.Code, "%s: %v", what, err)
	}
	for _, ra := range []string{"infinity", "-infinity"} {
		_, err = producerPool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, run_after) VALUES ('default', 'k', $1::timestamptz)`, ra)
		checkViolation(err, "producer: run_after "+ra)
	}
	_, err = producerPool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, max_attempts) VALUES ('default', 'k', 0)`)
	checkViolation(err, "producer: max_attempts 0")
	_, err = workerPool.Exec(ctx, `UPDATE `+jobs+` SET attempts = 2147483647 WHERE id = $1`, mine.ID)
	checkViolation(err, "worker: attempts 2147483647")
	_, err = workerPool.Exec(ctx, `UPDATE `+jobs+` SET attempts = 5 WHERE id = $1`, mine.ID)
	checkViolation(err, "worker: a pending job with no attempt left")
	_, err = workerPool.Exec(ctx, `UPDATE `+jobs+` SET run_after = 'infinity' WHERE id = $1`, mine.ID)
	checkViolation(err, "worker: run_after infinity")
	_, err = operatorPool.Exec(ctx, `UPDATE `+jobs+` SET run_after = '-infinity' WHERE id = $1`, mine.ID)
	checkViolation(err, "operator: run_after -infinity")
}
