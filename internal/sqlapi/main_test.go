package sqlapi_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testKind is the kind every job of these tests has.
const testKind = "sqlapi.test"

// world is a migrated schema with a business table (orders), the admin
// pool that owns it, and a producer role granted what docs/grants.sql
// grants {{producer_role}} plus INSERT on orders.
type world struct {
	t        *testing.T
	admin    *pgxpool.Pool
	schema   string
	producer string // role name
	prodURL  string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{t: t, admin: pgtest.Pool(t)}
	w.schema = pgtest.SchemaOn(t, w.admin)
	_, err := migrations.Up(ctx, w.admin, w.schema)
	require.NoError(t, err)
	_, err = w.admin.Exec(ctx, `CREATE TABLE `+w.table("orders")+` (id bigserial PRIMARY KEY, note text NOT NULL)`)
	require.NoError(t, err)
	app := w.newRole("sqlapi_app")
	w.producer = w.newRole("sqlapi_producer")
	b, err := os.ReadFile("../../docs/grants.sql")
	require.NoError(t, err)
	grants := strings.NewReplacer("{{schema}}", sqlident.Quote(w.schema), "{{producer_role}}", sqlident.Quote(app),
		"{{worker_role}}", sqlident.Quote(app), "{{operator_role}}", sqlident.Quote(app), "{{stream_role}}", sqlident.Quote(app),
		"{{sql_producer_role}}", sqlident.Quote(w.producer)).Replace(string(b))
	_, err = w.admin.Exec(ctx, grants)
	require.NoError(t, err)
	_, err = w.admin.Exec(ctx, `GRANT INSERT ON `+w.table("orders")+` TO `+sqlident.Quote(w.producer)+`;
		GRANT USAGE ON SEQUENCE `+w.table("orders_id_seq")+` TO `+sqlident.Quote(w.producer))
	require.NoError(t, err)
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	u.User = url.User(w.producer)
	if p, ok := userPassword(pgtest.URL()); ok {
		_, err = w.admin.Exec(ctx, `ALTER ROLE `+sqlident.Quote(w.producer)+` PASSWORD '`+strings.ReplaceAll(p, "'", "''")+`'`)
		require.NoError(t, err)
		u.User = url.UserPassword(w.producer, p)
	}
	w.prodURL = u.String()
	return w
}

// userPassword is the password of a database URL, if it has one (a
// $TEST_DATABASE_URL server may not trust local connections).
func userPassword(u string) (string, bool) {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return "", false
	}
	return p.User.Password()
}

func (w *world) table(name string) string { return sqlident.Quote(w.schema, name) }

func (w *world) fn(name string) string { return sqlident.Quote(w.schema, name) }

// newRole creates a login role with no privileges, dropped at cleanup.
func (w *world) newRole(prefix string) string {
	w.t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("%s_%08x", prefix, rand.Uint32())
	_, err := w.admin.Exec(ctx, `CREATE ROLE `+sqlident.Quote(name)+` LOGIN`)
	require.NoError(w.t, err)
	w.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = w.admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name)
		_, _ = w.admin.Exec(ctx, `DROP OWNED BY `+sqlident.Quote(name))
		_, _ = w.admin.Exec(ctx, `DROP ROLE `+sqlident.Quote(name))
	})
	return name
}

// producerPool is a pool that connects as the producer role.
func (w *world) producerPool() *pgxpool.Pool {
	return pgtest.PoolOn(w.t, w.prodURL, func(c *pgxpool.Config) { c.MaxConns = 4 })
}

func (w *world) count(sql string, args ...any) int {
	w.t.Helper()
	var n int
	require.NoError(w.t, w.admin.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// worker is an idle Go worker on one queue with a one-hour poll: a job it
// runs soon after its commit was announced by a NOTIFY.
type worker struct {
	mu      sync.Mutex
	started map[int64]time.Time
	payload map[int64]string
	ran     chan int64
}

// startWorker runs a worker for queue q and returns once it sleeps (its
// waiter row is idle).
func (w *world) startWorker(q string) *worker {
	w.t.Helper()
	wk := &worker{started: map[int64]time.Time{}, payload: map[int64]string{}, ran: make(chan int64, 1000)}
	pool := pgtest.NewPool(w.t, func(c *pgxpool.Config) { c.MaxConns = 6 })
	c, err := queue.New(pool, queue.Config{
		Schema:       w.schema,
		Queues:       map[string]queue.QueueConfig{q: {MaxWorkers: 2}},
		PollInterval: time.Hour,
		Handlers: map[string]queue.Handler{testKind: queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			at := time.Now()
			wk.mu.Lock()
			wk.started[j.ID] = at
			wk.payload[j.ID] = string(j.Payload)
			wk.mu.Unlock()
			wk.ran <- j.ID
			return nil
		})},
	})
	require.NoError(w.t, err)
	pgtest.RunInBackground(w.t, "worker", c.Run)
	deadline := time.Now().Add(30 * time.Second)
	for w.count(`SELECT count(*) FROM `+w.table("waiters")+` WHERE queue = $1 AND idle`, q) == 0 {
		require.True(w.t, time.Now().Before(deadline), "the worker did not go idle")
		time.Sleep(10 * time.Millisecond)
	}
	return wk
}

// wait waits until the worker has started every job of ids.
func (wk *worker) wait(t *testing.T, ids []int64, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		wk.mu.Lock()
		missing := 0
		for _, id := range ids {
			if _, ok := wk.started[id]; !ok {
				missing++
			}
		}
		wk.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-wk.ran:
		case <-deadline:
			t.Fatalf("%d of %d jobs not run within %s: a wake-up was missed (the poll is an hour)", missing, len(ids), d)
		}
	}
}

func (wk *worker) startedAt(id int64) time.Time {
	wk.mu.Lock()
	defer wk.mu.Unlock()
	return wk.started[id]
}
