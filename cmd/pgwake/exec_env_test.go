package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// TestHandlerEnvironmentHasNoConnectionSettings runs a handler command that
// prints its environment: pgwake's URLs, DATABASE_URL and the libpq
// variables are gone (other variables stay) unless they are passed on
// purpose (--handler-connection-env).
func TestHandlerEnvironmentHasNoConnectionSettings(t *testing.T) {
	t.Parallel()
	environ := []string{
		"PATH=/usr/bin:/bin", "HOME=/home/app", "APP_SETTING=kept",
		envDatabaseURL + "=postgres://app:s3cretPW@db/app", envFallbackURL + "=postgres://app:s3cretPW@db/app",
		"PGWAKE_LISTENER_URL=postgres://app:s3cretPW@db/app", envBrokerURL + "=amqp://app:s3cretPW@mq/",
		"PGPASSWORD=s3cretPW", "PGSSLPASSWORD=s3cretPW", "PGHOST=db", "PGUSER=app", "PGSERVICE=pgwake",
	}
	run := func(pass bool) string {
		var out bytes.Buffer
		h := &execHandler{command: "env", env: handlerEnviron(environ, pass), stdout: &out, stderr: &out, procs: newProcGroups()}
		require.NoError(t, h.Handle(context.Background(), nil, &queue.Job{ID: 7, Kind: "k", Queue: "q", Attempt: 1, MaxAttempts: 1}))
		return out.String()
	}
	got := run(false)
	require.NotContains(t, got, "s3cretPW")
	for _, k := range []string{"PGHOST=", "PGUSER=", "PGSERVICE=", "DATABASE_URL=", "PGWAKE_LISTENER_URL="} {
		require.NotContains(t, got, k)
	}
	require.Contains(t, got, "APP_SETTING=kept")
	require.Contains(t, got, "HOME=/home/app")
	require.Contains(t, got, "PGWAKE_JOB_ID=7")
	passed := run(true)
	require.Contains(t, passed, "PGPASSWORD=s3cretPW")
	require.Contains(t, passed, envDatabaseURL+"=postgres://app:s3cretPW@db/app")
	require.True(t, strings.Contains(passed, "PGWAKE_JOB_ID=7"))
}

// TestHandlerOutputIsPrefixedAndEscaped: every line a handler command
// writes reaches the worker's output prefixed with its job and with control
// characters escaped, so it can neither pass for one of pgwake's log lines
// nor drive the terminal; a last line without a newline is kept, a very long
// line is cut into pieces that are each prefixed.
func TestHandlerOutputIsPrefixedAndEscaped(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	h := &execHandler{
		command: `printf '2026-01-01T00:00:00.000Z\tINFO\tworker\tjob succeeded\n\033]0;pwned\007\033[2J\r\nlast'; ` +
			`printf 'oops\n' >&2; head -c 40000 /dev/zero | tr '\0' x`,
		env: []string{"PATH=/usr/bin:/bin"}, stdout: &stdout, stderr: &stderr, procs: newProcGroups(),
	}
	require.NoError(t, h.Handle(context.Background(), nil, &queue.Job{ID: 42, Kind: "k", Queue: "q", Attempt: 1, MaxAttempts: 1}))
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	require.Equal(t, "job 42 k stdout: 2026-01-01T00:00:00.000Z\\x09INFO\\x09worker\\x09job succeeded", lines[0])
	require.Equal(t, `job 42 k stdout: \x1b]0;pwned\x07\x1b[2J`, lines[1])
	require.True(t, strings.HasPrefix(lines[2], "job 42 k stdout: last"), lines[2])
	require.Greater(t, len(lines), 4, "a 40,000-byte line is cut into pieces")
	for _, l := range lines {
		require.True(t, strings.HasPrefix(l, "job 42 k stdout: "), "%.80q", l)
		require.LessOrEqual(t, len(l), lineWriterMax+len("job 42 k stdout: "))
	}
	require.Equal(t, "job 42 k stderr: oops\n", stderr.String())
}
