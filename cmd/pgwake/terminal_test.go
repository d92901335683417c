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
// `jobs show`, `stats` and `queues list` print them escaped, and the --json
// outputs and `events replay` as JSON escapes.
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
		{"queues", "list", "--schema", schema},
	} {
		out := mustRun(t, "", args...)
		require.False(t, strings.ContainsAny(out, "\x1b\x07\u009b"), "pgwake %v printed a control character:\n%q", args, out)
		require.Contains(t, out, `q\x1b[2J`, "pgwake %v", args)
	}
	// --json: the encoder escapes ESC and BEL but not C1 (CSI, U+009B) nor
	// DEL; they are escaped too, the JSON unchanged in meaning.
	_, err := pgtest.Pool(t).Exec(context.Background(), `INSERT INTO `+sqlident.Quote(schema, "jobs")+
		` (queue, kind, last_error, payload) VALUES ($1, $2, $3, $4::jsonb)`, "c\u009b2J", "k\u009b2J\x7f", "e\u009b2J", `{"a": "\u009b6n"}`)
	require.NoError(t, err)
	_, err = pgtest.Pool(t).Exec(context.Background(), `INSERT INTO `+sqlident.Quote(schema, "events")+
		` (job_id, type, queue, kind, attempt, data) VALUES ($1, 'failed', $2, 'k', 1, jsonb_build_object('error', $3::text))`, id+1, "c\u009b2J", "e\u009b2J")
	require.NoError(t, err)
	for _, args := range [][]string{
		{"jobs", "list", "--json", "--schema", schema},
		{"jobs", "show", "--json", fmt.Sprint(id + 1), "--schema", schema},
		{"stats", "--json", "--schema", schema},
		{"queues", "list", "--json", "--schema", schema},
		{"events", "replay", "--schema", schema},
	} {
		out := mustRun(t, "", args...)
		require.False(t, strings.ContainsAny(out, "\x1b\x07\x7f\u009b"), "pgwake %v printed a control character:\n%q", args, out)
		require.Contains(t, out, `c\u009b2J`, "pgwake %v", args)
	}
	out := mustRun(t, "", "jobs", "show", fmt.Sprint(id), "--schema", schema)
	for _, want := range []string{`k\x1b]0;pwned\x07`, `u\x1b[31m`, `line one\x1b[8m`, `line two \u009b2J`, `\u009b6n`} {
		require.Contains(t, out, want)
	}
}
