package ui_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
}

// setup migrates a fresh schema and serves a dashboard on it, its live
// feed running until the test ends.
func setup(t testing.TB, cfg ui.Config) *bundle {
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
	cc, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	l, err := notify.New(notify.Config{ConnConfig: cc})
	require.NoError(t, err)
	pgtest.RunInBackground(t, "listener", l.Run)
	cfg.Client, cfg.Listener = client, l
	h, err := ui.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	// Stopped first (cleanups run last-in first-out): the feed closes the
	// open streams, so the server's Close does not wait for them.
	pgtest.RunInBackground(t, "dashboard feed", h.Run)
	select {
	case <-h.Started():
	case <-time.After(30 * time.Second):
		t.Fatal("the dashboard feed did not start")
	}
	return &bundle{schema: schema, client: client, h: h, srv: srv, url: srv.URL + cfg.Prefix}
}
