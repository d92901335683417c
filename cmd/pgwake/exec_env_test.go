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
