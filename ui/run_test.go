package ui_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// Stopping Run ends the open streams, unregisters the watcher and leaves
// no goroutine behind.
func TestRunStopsCleanly(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	client, schema := migratedClient(t, pool)
	_, err := client.Enqueue(ctx, queue.NewJob{Kind: "k"}) // warm the pool
	require.NoError(t, err)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("internal/poll.runtime_pollWait"))

	cc, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	l, err := notify.New(notify.Config{ConnConfig: cc})
	require.NoError(t, err)
	h, err := ui.New(ui.Config{Client: client, Listener: l})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	runCtx, cancel := context.WithCancel(ctx)
	lDone, hDone := make(chan error, 1), make(chan error, 1)
	go func() { lDone <- l.Run(runCtx) }()
	go func() { hDone <- h.Run(runCtx) }()
	watchers := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.event_watchers`).Scan(&n))
		return n
	}
	pgtest.WaitFor(t, 30*time.Second, "watcher registered", func() bool { return watchers() == 1 })
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	ch := stream(t, sctx, srv.URL+"/events", "")
	cancel()
	require.NoError(t, <-hDone)
	require.NoError(t, <-lDone)
	for range ch { // the stream ends
	}
	require.Zero(t, watchers(), "the watcher row is removed")
	// A stream asked for after Run ended is refused at once (it hung
	// before: nothing would ever close it; then it ended at once with a 200,
	// and pages reconnected each second: TestStreamWithoutTheFeed).
	resp, err := http.Get(srv.URL + "/events")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	srv.Close()
	srv.Client().CloseIdleConnections()
}
