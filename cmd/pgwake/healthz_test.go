package main

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgwake/pgwake/internal/pgtest"
)

// TestHealthzRevealsNothing: when the database refuses the worker's role,
// /healthz answers 503 with no role, host or database name; the cause goes
// to the log.
func TestHealthzRevealsNothing(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	u.User = url.UserPassword("secret_role_name", "wrong")
	u.Path = "/secret_db_name"
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	defer pool.Close()
	core, logs := observer.New(zap.WarnLevel)
	ms, err := listenMetrics("127.0.0.1:0", newRegistry(), pool, zap.New(core))
	require.NoError(t, err)
	go ms.serve(zap.NewNop())
	defer ms.shutdown()
	code, body := httpGet(t, "http://"+ms.addr+"/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "database unreachable\n", body)
	entries := logs.FilterMessage("health check failed: database unreachable").All()
	require.Len(t, entries, 1)
	require.Contains(t, entries[0].ContextMap()["cause"], "secret_role_name")
}
