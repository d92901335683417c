package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/promreg"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	if os.Getenv(corkHelperEnv) != "" {
		os.Exit(corkHelperMain())
	}
	pgtest.Main(m)
}

// env is one test's schema, pool, client and metrics registry.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	reg    *prometheus.Registry
	c      *queue.Client
	// signals are c's test signals, when the test turned them on.
	signals queue.Signals
}

// newEnv migrates a fresh schema and builds a client on it.
func newEnv(t *testing.T, cfg queue.Config) *env {
	t.Helper()
	return newEnvWithPool(t, pgtest.Pool(t), cfg)
}

// newEnvOwnPool is newEnv on a pool of its own with maxConns connections,
// for tests whose timing must not depend on parallel tests sharing a pool.
func newEnvOwnPool(t *testing.T, maxConns int32, cfg queue.Config) *env {
	t.Helper()
	return newEnvWithPool(t, pgtest.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = maxConns }), cfg)
}

func newEnvWithPool(t *testing.T, pool *pgxpool.Pool, cfg queue.Config) *env {
	t.Helper()
	schema := pgtest.SchemaOn(t, pool)
	_, err := migrations.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `CREATE TABLE `+sqlident.Quote(schema, "effects")+` (job_id bigint NOT NULL, attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	return newEnvOn(t, pool, schema, cfg)
}

func newEnvOn(t *testing.T, pool *pgxpool.Pool, schema string, cfg queue.Config) *env {
	t.Helper()
	cfg.Schema = schema
	reg := prometheus.NewRegistry()
	if cfg.Registerer == nil {
		cfg.Registerer = reg
	}
	c, err := queue.New(pool, cfg)
	require.NoError(t, err)
	return &env{t: t, pool: pool, schema: schema, reg: reg, c: c}
}

func (e *env) table(name string) string { return sqlident.Quote(e.schema, name) }

// run starts the client's workers and stops them at cleanup.
func (e *env) run() (stop func()) {
	return pgtest.RunInBackground(e.t, "queue client", e.c.Run)
}

// effect records, in the claim transaction, that a handler ran.
func effect(ctx context.Context, tx pgx.Tx, schema string, job *queue.Job) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+sqlident.Quote(schema, "effects")+` (job_id, attempt) VALUES ($1, $2)`, job.ID, job.Attempt)
	return err
}

// waitFor is pgtest.WaitFor.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, d, what, cond)
}

func (e *env) count(where string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.table("jobs")+` WHERE `+where, args...).Scan(&n))
	return n
}

func (e *env) countSQL(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// metric sums the samples of a metric family whose labels include want.
func (e *env) metric(name string, want map[string]string) float64 {
	e.t.Helper()
	var labels []string
	for k, v := range want {
		labels = append(labels, k, v)
	}
	v, err := promreg.Sum(e.reg, name, labels...)
	require.NoError(e.t, err)
	return v
}

// checkEventsMatchJobs rebuilds every job's state from the event log and
// compares it with the jobs table.
func checkEventsMatchJobs(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	ctx := context.Background()
	type st struct {
		state    queue.JobState
		attempts int
	}
	// One snapshot for both tables: workers may still be running.
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	fromJobs := map[int64]st{}
	rows, err := tx.Query(ctx, `SELECT id, state, attempts FROM `+sqlident.Quote(schema, "jobs"))
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var s st
		require.NoError(t, rows.Scan(&id, &s.state, &s.attempts))
		fromJobs[id] = s
	}
	require.NoError(t, rows.Err())

	fromEvents := map[int64]st{}
	rows, err = tx.Query(ctx, `SELECT job_id, type, attempt FROM `+sqlident.Quote(schema, "events")+` ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var typ queue.EventType
		var attempt int
		require.NoError(t, rows.Scan(&id, &typ, &attempt))
		s, seen := fromEvents[id]
		if typ == queue.EventEnqueued {
			require.False(t, seen, "job %d enqueued twice", id)
		} else {
			require.True(t, seen, "job %d has %s before enqueued", id, typ)
		}
		state, ok := queue.Next(s.state, typ)
		require.True(t, ok, "job %d: %q after %q is not in the transition table", id, typ, s.state)
		s.state = state
		s.attempts = attempt
		fromEvents[id] = s
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(fromJobs), len(fromEvents), "jobs and jobs with events")
	for id, want := range fromJobs {
		require.Equal(t, want, fromEvents[id], "job %d: state from events vs jobs table", id)
	}
}

// effectCounts returns how many effects each job has.
func (e *env) effectCounts() map[int64]int {
	rows, err := e.pool.Query(context.Background(), `SELECT job_id, count(*) FROM `+e.table("effects")+` GROUP BY 1`)
	require.NoError(e.t, err)
	out := map[int64]int{}
	for rows.Next() {
		var id int64
		var n int
		require.NoError(e.t, rows.Scan(&id, &n))
		out[id] = n
	}
	require.NoError(e.t, rows.Err())
	return out
}

// requireExactlyOnce checks every job succeeded with exactly one effect.
func (e *env) requireExactlyOnce(ids []int64) {
	e.t.Helper()
	counts := e.effectCounts()
	var dup, missing []int64
	for _, id := range ids {
		switch n := counts[id]; {
		case n == 0:
			missing = append(missing, id)
		case n > 1:
			dup = append(dup, id)
		}
	}
	sort.Slice(dup, func(i, j int) bool { return dup[i] < dup[j] })
	require.Empty(e.t, dup, "jobs with more than one effect")
	require.Empty(e.t, missing, "jobs with no effect")
	require.Equal(e.t, len(ids), len(counts), "effects for unknown jobs")
	require.Equal(e.t, len(ids), e.count(`state = 'succeeded'`))
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprint(err))
	}
	return b
}

// bothModes runs f as the parallel subtests "held" and "leased" (the
// handlers' kinds in Config.LeasedKinds for the second).
func bothModes(t *testing.T, f func(t *testing.T, leased bool)) {
	for _, leased := range []bool{false, true} {
		t.Run(map[bool]string{false: "held", true: "leased"}[leased], func(t *testing.T) {
			t.Parallel()
			f(t, leased)
		})
	}
}

// enqueueIDs enqueues jobs in one EnqueueMany and returns their ids.
func (e *env) enqueueIDs(jobs ...queue.NewJob) []int64 {
	e.t.Helper()
	res, err := e.c.EnqueueMany(context.Background(), jobs)
	require.NoError(e.t, err)
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids
}
