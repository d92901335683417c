package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// TestCLIOutputHasNoTerminalEscapes: a job row written by a role with the
// jobs grants carries terminal escape sequences in its queue, kind, unique
// key, error and payload (ESC, BEL, CSI as a C1 character). `jobs list`,
// `jobs show` and `stats` print them escaped.
func TestCLIOutputHasNoTerminalEscapes(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), `INSERT INTO `+sqlident.Quote(schema, "jobs")+
		` (queue, kind, unique_key, last_error, payload) VALUES ($1, $2, $3, $4, $5::jsonb) RETURNING id`,
		"q\x1b[2J", "k\x1b]0;pwned\x07", "u\x1b[31m", "line one\x1b[8m\nline two \u009b2J", `{"a": "\u009b6n"}`).Scan(&id))
	for _, args := range [][]string{
		{"jobs", "list", "--schema", schema},
		{"jobs", "list", "--schema", schema, "--state", "pending"},
		{"jobs", "show", fmt.Sprint(id), "--schema", schema},
		{"stats", "--schema", schema},
	} {
		out := mustRun(t, "", args...)
		require.False(t, strings.ContainsAny(out, "\x1b\x07\u009b"), "pgwake %v printed a control character:\n%q", args, out)
		require.Contains(t, out, `q\x1b[2J`, "pgwake %v", args)
	}
	out := mustRun(t, "", "jobs", "show", fmt.Sprint(id), "--schema", schema)
	for _, want := range []string{`k\x1b]0;pwned\x07`, `u\x1b[31m`, `line one\x1b[8m`, `line two \u009b2J`, `\u009b6n`} {
		require.Contains(t, out, want)
	}
}
