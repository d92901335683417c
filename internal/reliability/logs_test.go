package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgwake/pgwake/queue"
)

// TestLogsHoldNoPayloadsOrPasswords logs everything (debug level) while
// jobs succeed, fail, panic, have no handler and time out, and while the
// listener cannot connect and connections are terminated; no log entry
// carries a payload or the connection password.
func TestLogsHoldNoPayloadsOrPasswords(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	ctx := context.Background()
	app, appURL := w.newRole("pgwake_logs", "")
	w.applyGrants(app, app, app, app, app)
	pass := appURL[strings.Index(appURL, ":pw")+1 : strings.Index(appURL, "@")]
	require.True(t, strings.HasPrefix(pass, "pw"))
	secret := fmt.Sprintf("SECRET-PAYLOAD-%016x", rand.Uint64())

	core, logs := observer.New(zap.DebugLevel)
	pool := w.poolOn(appURL, appWorker, 8)
	// The listener dials a closed port with the same password: it logs
	// connection errors and reconnects.
	lcc := pool.Config().ConnConfig.Copy()
	lcc.Port = 1
	lcc.Fallbacks = nil // sslmode=prefer adds one on the real port
	c, err := queue.New(pool, queue.Config{
		Schema:             w.schema,
		Queues:             map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		PollInterval:       50 * time.Millisecond,
		Logger:             zap.New(core),
		ListenerConnConfig: lcc,
		KindTimeouts:       map[string]time.Duration{"slow": 50 * time.Millisecond},
		Handlers: map[string]queue.Handler{
			"ok":    queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil }),
			"fail":  queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return errors.New("failed") }),
			"panic": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { panic("oops") }),
			"slow": queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, _ *queue.Job) error {
				<-ctx.Done()
				return ctx.Err()
			}),
		},
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	kinds := []string{"ok", "fail", "panic", "slow", "unknown"}
	for _, k := range kinds {
		_, err := c.Enqueue(ctx, queue.NewJob{Kind: k, MaxAttempts: 1, Payload: map[string]string{"secret": secret}, UniqueKey: "u-" + k})
		require.NoError(t, err)
	}
	w.waitAllFinal(len(kinds), time.Minute)
	_, err = w.admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, app)
	require.NoError(t, err)
	// The pool may hand out each terminated idle connection once (up to its 8).
	for range 10 {
		if _, err = c.Enqueue(ctx, queue.NewJob{Kind: "ok", Payload: map[string]string{"secret": secret}}); err == nil {
			break
		}
	}
	require.NoError(t, err)
	w.waitAllFinal(len(kinds)+1, time.Minute)
	cancel()
	require.NoError(t, <-done)

	entries := logs.All()
	require.NotEmpty(t, entries)
	sawListener := false
	for _, e := range entries {
		line := e.Message + " " + fmt.Sprint(e.ContextMap())
		require.NotContains(t, line, secret, "a log entry carries the payload")
		require.NotContains(t, line, pass, "a log entry carries the password")
		if strings.Contains(line, "127.0.0.1") || strings.Contains(strings.ToLower(line), "connect") {
			sawListener = true
		}
	}
	require.True(t, sawListener, "the listener's connection errors were not logged; the test proves little")
	t.Logf("%d log entries checked", len(entries))
}
