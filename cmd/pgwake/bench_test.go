package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBenchJSON(t *testing.T) {
	t.Parallel()
	out := mustRun(t, "", "bench", "--modes", "drain,latency", "--json", "--jobs", "200", "--rate", "50",
		"--duration", "1s", "--workers", "2")
	var runs []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		require.EqualValues(t, 0, r["duplicates"], line)
		require.EqualValues(t, 0, r["missing"], line)
		require.Greater(t, r["jobs_per_sec"], 0.0, line)
		runs = append(runs, r["system"].(string)+" "+r["mode"].(string))
	}
	// Each mode in held mode, then leased mode.
	require.Equal(t, []string{"pgwake drain", "pgwake-leased drain", "pgwake latency", "pgwake-leased latency"}, runs)
}

func TestBenchBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--modes", "drain,warp"},
		{"bench", "--rate", "-1"},
		{"bench", "--workers", "0"},
		{"bench", "--jobs", "0"},
		{"bench", "--duration", "0s"},
	} {
		r := pgwake(t, "", args...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "pgwake bench:", args)
		require.Empty(t, r.stdout)
	}
}
