package ui_test

import (
	"context"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// bundle is one test's schema, client, running dashboard and server.
type bundle struct {
	schema string
	client *queue.Client
	h      *ui.Handler
	srv    *httptest.Server
	url    string // the server's URL with the prefix
	stop   func() // stops the feed, the server and the listener before the test ends
}

// setup migrates a fresh schema and serves a dashboard on it, its live
// feed running until the test ends.
func setup(t testing.TB, cfg ui.Config) *bundle { return setupMarked(t, cfg, nil) }

// migratedClient migrates a fresh schema through pool and returns a queue
// client on it, with the schema's name.
func migratedClient(tb testing.TB, pool *pgxpool.Pool) (*queue.Client, string) {
	tb.Helper()
	schema := pgtest.SchemaOn(tb, pool)
	_, err := migrations.Up(context.Background(), pool, schema)
	require.NoError(tb, err)
	client, err := queue.New(pool, queue.Config{Schema: schema})
	require.NoError(tb, err)
	return client, schema
}

// setupMarked is setup with the feed's and the server's contexts passed
// through mark (when not nil): a tracer on the pool can then tell the
// dashboard's statements from the rest of the process's.
func setupMarked(t testing.TB, cfg ui.Config, mark func(context.Context) context.Context) *bundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaOn(t, pool)
	if cfg.Client != nil { // a schema of the caller's
		schema = cfg.Client.Schema()
	}
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	client := cfg.Client
	if client == nil {
		client, err = queue.New(pool, queue.Config{Schema: schema})
		require.NoError(t, err)
	}
	stopListener := func() {}
	if cfg.Listener == nil { // else the caller's, which it runs
		cc, err := pgx.ParseConfig(pgtest.URL())
		require.NoError(t, err)
		l, err := notify.New(notify.Config{ConnConfig: cc})
		require.NoError(t, err)
		stopListener = pgtest.RunInBackground(t, "listener", l.Run)
		cfg.Listener = l
	}
	cfg.Client = client
	h, err := ui.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(h)
	run := h.Run
	if mark != nil {
		srv.Config.BaseContext = func(net.Listener) context.Context { return mark(context.Background()) }
		run = func(ctx context.Context) error { return h.Run(mark(ctx)) }
	}
	srv.Start()
	t.Cleanup(srv.Close)
	// Stopped first (cleanups run last-in first-out): the feed closes the
	// open streams, so the server's Close does not wait for them.
	stopFeed := pgtest.RunInBackground(t, "dashboard feed", run)
	select {
	case <-h.Started():
	case <-time.After(30 * time.Second):
		t.Fatal("the dashboard feed did not start")
	}
	stop := func() { stopFeed(); srv.Close(); stopListener() }
	return &bundle{schema: schema, client: client, h: h, srv: srv, url: srv.URL + cfg.Prefix, stop: stop}
}
