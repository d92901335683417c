package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
)

// TestMetricsBindLoopbackByDefault: the metrics endpoint is reachable only
// from the host unless the operator asks otherwise.
func TestMetricsBindLoopbackByDefault(t *testing.T) {
	t.Parallel()
	host, _, err := net.SplitHostPort(defaultMetricsAddr)
	require.NoError(t, err)
	ip := net.ParseIP(host)
	require.NotNil(t, ip, "default metrics host %q is not an IP", host)
	require.True(t, ip.IsLoopback(), "default metrics address %s is not loopback", defaultMetricsAddr)
	for _, cmd := range []string{"worker", "demo"} {
		var out, errOut bytes.Buffer
		runMain([]string{cmd, "--help"}, strings.NewReader(""), &out, &errOut)
		require.Contains(t, out.String()+errOut.String(), defaultMetricsAddr, "%s --help does not show the loopback default", cmd)
	}
}

// TestHostileNamesOnTheCommandLine: schema and queue names from flags that
// would break out of SQL are refused before anything is written.
func TestHostileNamesOnTheCommandLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	names := []string{`x"; DROP TABLE canary; --`, `x'; SELECT 1; --`, "a\x00b", "ünï", strings.Repeat("s", 64), "UPPER"}
	// Schemas these names could have produced (as given, folded to lower
	// case, cut to 63 bytes); other tests create their own schemas meanwhile.
	var candidates []string
	for _, n := range names {
		if strings.ContainsRune(n, 0) {
			continue
		}
		for _, c := range []string{n, strings.ToLower(n)} {
			candidates = append(candidates, c)
			if len(c) > 63 {
				candidates = append(candidates, c[:63])
			}
		}
	}
	countHostile := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname::text = ANY($1::text[])`, candidates).Scan(&n))
		return n
	}
	before := countHostile()
	for _, name := range names {
		for _, args := range [][]string{
			{"migrate", "--schema", name},
			{"enqueue", "--schema", name, "--kind", "k"},
			{"enqueue", "--queue", name, "--kind", "k"},
			{"worker", "--schema", name, "--handler", "k=true"},
			{"stats", "--schema", name},
		} {
			var out, errOut bytes.Buffer
			code := runMain(append(args, "--database-url", pgtest.URL()), strings.NewReader(""), &out, &errOut)
			require.NotEqual(t, 0, code, "pgwake %q succeeded", args)
			require.NotContains(t, errOut.String(), "SQLSTATE", "pgwake %q reached the database: %s", args, errOut.String())
		}
	}
	require.Zero(t, before)
	require.Zero(t, countHostile(), "a schema was created")
}
