package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

func init() {
	register(command{
		name:    "ui",
		summary: "serve the live web dashboard",
		usage: `Usage: pgwake ui [--addr 127.0.0.1:8080] [--token T] [--read-only] [--prefix /P] [flags]

Serves a dashboard: every queue's counters (pending, scheduled, running,
failed, done in the last minute, oldest pending, paused), throughput and
latency sparklines, the jobs with filters and pages, each job's payload,
errors and event history, and the actions retry, cancel, pause and resume
(confirmed, each writing its event). It updates live: one LISTEN per
process, fed by a NOTIFY that transactions writing events send at commit
while a dashboard runs (a heartbeat row in the schema's event_watchers
table), at most one per 25 ms, then the event log; pages get server-sent
events. See docs/ui.md.

It binds 127.0.0.1 by default. Any other address needs --token (or
$PGWAKE_UI_TOKEN): open http://HOST:PORT/?token=T once (a cookie keeps it),
or send "Authorization: Bearer T". --read-only hides the actions and
refuses them.

Example:
  pgwake ui --addr 127.0.0.1:8080
  pgwake ui --addr 0.0.0.0:8080 --token "$(openssl rand -hex 16)" --read-only`,
		run: runUI,
	})
}

// isLoopback reports whether addr's host only listens on loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func runUI(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	addr := fs.String("addr", "127.0.0.1:8080", "address to serve on; anything but loopback needs --token")
	token := fs.String("token", "", "token every request must carry ($"+envUIToken+")")
	readOnly := fs.Bool("read-only", false, "hide the actions (retry, cancel, pause, resume) and refuse them")
	prefix := fs.String("prefix", "", "path prefix to serve under, e.g. /pgwake (behind a reverse proxy)")
	exact := fs.Int("exact-limit", queue.DefaultExactLimit, "count each number exactly up to this many jobs per queue (see pgwake stats)")
	listenerURL := fs.String("listener-url", "", "direct PostgreSQL URL for LISTEN when --database-url goes through PgBouncer in transaction mode ($"+envListenerURL+")")
	maxStreams := fs.Int("max-streams", 100, "most pages kept live at once; one more is refused (503) and tries again later")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	if *maxStreams < 1 {
		return usagef("--max-streams %d: use at least 1", *maxStreams)
	}
	if *token == "" {
		*token = envOr(envUIToken, "")
	}
	if *listenerURL == "" {
		*listenerURL = envOr(envListenerURL, "")
	}
	if !isLoopback(*addr) && *token == "" {
		return usagef("--addr %s is not a loopback address: set --token (or $%s) so that only holders of the token can see and act on the queue", *addr, envUIToken)
	}
	if *exact < -1 {
		return usagef("--exact-limit %d: use -1 (no limit) or a count", *exact)
	}
	if *prefix != "" && (!strings.HasPrefix(*prefix, "/") || strings.HasSuffix(*prefix, "/")) {
		return usagef("--prefix %q: start it with / and do not end it with one", *prefix)
	}
	client, pool, err := env.connectClient(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkSchema(ctx, pool, env.schema); err != nil {
		return err
	}
	cc := pool.Config().ConnConfig
	if *listenerURL != "" {
		if cc, err = pgx.ParseConfig(*listenerURL); err != nil {
			return usagef("--listener-url %s: %s", redactURL(*listenerURL), parseErrCause(err))
		}
	}
	listener, err := notify.New(notify.Config{ConnConfig: cc, ApplicationName: "pgwake-ui", Logger: env.log})
	if err != nil {
		return err
	}
	h, err := ui.New(ui.Config{Client: client, Listener: listener, Prefix: *prefix, Token: *token,
		ReadOnly: *readOnly, ExactLimit: *exact, MaxStreams: *maxStreams, Logger: env.log})
	if err != nil {
		return usagef("%v", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("cannot serve on %s: %w; pick another --addr", *addr, errors.Unwrap(err))
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 3)
	go func() { done <- listener.Run(runCtx) }()
	go func() { done <- h.Run(runCtx) }()
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintf(env.stdout, "pgwake ui: serving on http://%s%s/\n", ln.Addr(), *prefix)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-done:
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	if runErr != nil && !errors.Is(runErr, http.ErrServerClosed) && !errors.Is(runErr, context.Canceled) {
		env.log.Warn("dashboard stopped", zap.Error(runErr))
		return runErr
	}
	return nil
}
