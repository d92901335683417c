package main

import (
	"io"
	"net/http"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
)

func TestUIBindNeedsTokenOffLoopback(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	r := pgwake(t, "", "ui", "--schema", schema, "--addr", "0.0.0.0:0")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "not a loopback address: set --token")
	r = pgwake(t, "", "ui", "--schema", schema, "--addr", "[::]:0")
	require.Equal(t, 2, r.code, r.stderr)
	for _, a := range []string{"127.0.0.1:8080", "localhost:1", "[::1]:80"} {
		require.True(t, isLoopback(a), a)
	}
	for _, a := range []string{"0.0.0.0:8080", ":8080", "10.0.0.1:80", "example.com:80", "nonsense"} {
		require.False(t, isLoopback(a), a)
	}

	// With a token it serves, and refuses requests without it.
	p := startPgwake(t, "ui", "--schema", schema, "--addr", "0.0.0.0:0", "--token", "tok", "--read-only")
	re := regexp.MustCompile(`serving on http://\S*:(\d+)/`)
	var port string
	pgtest.WaitFor(t, 30*time.Second, "ui serving", func() bool {
		m := re.FindStringSubmatch(p.stdout.String())
		if m != nil {
			port = m[1]
		}
		return m != nil
	})
	resp, err := http.Get("http://127.0.0.1:" + port + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+port+"/api/stats", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `{"queues":[]}`, string(body))
	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.wait(), p.stderr.String())
}

// SIGTERM stops `pgwake ui` with a live stream open, exit 0 (the stream
// does not hold the shutdown).
func TestUIStopsWithAnOpenStream(t *testing.T) {
	schema := migrated(t)
	p := startPgwake(t, "ui", "--schema", schema, "--addr", "127.0.0.1:0")
	re := regexp.MustCompile(`serving on http://\S*:(\d+)/`)
	var port string
	waitFor(t, "ui serving", func() bool {
		m := re.FindStringSubmatch(p.stdout.String())
		if m != nil {
			port = m[1]
		}
		return m != nil
	})
	resp, err := http.Get("http://127.0.0.1:" + port + "/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	buf := make([]byte, 100)
	_, err = resp.Body.Read(buf) // the stream's first bytes: it is open
	require.NoError(t, err)
	t0 := time.Now()
	p.signal(syscall.SIGTERM)
	code := p.wait()
	require.Equal(t, 0, code, p.stderr.String())
	require.Less(t, time.Since(t0), 10*time.Second)
}
