package main

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// A paused queue keeps its job while the worker runs a periodic schedule;
// list, stats and periodic list show the state; resume runs the job.
func TestQueuesPauseAndPeriodic(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	ctx := context.Background()
	jobs := sqlident.Quote(schema, "jobs")
	count := func(where string) int {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+jobs+` WHERE `+where).Scan(&n))
		return n
	}

	require.Equal(t, "queue email paused\n", mustRun(t, "", "queues", "pause", "email", "--schema", schema))
	id := enqueueID(t, "", "--schema", schema, "--kind", "mail", "--queue", "email")
	out := mustRun(t, "", "queues", "list", "--json", "--schema", schema)
	var ql struct {
		Queues []struct {
			Queue  string `json:"queue"`
			Paused bool   `json:"paused"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ql), out)
	require.Len(t, ql.Queues, 1)
	require.Equal(t, "email", ql.Queues[0].Queue)
	require.True(t, ql.Queues[0].Paused)
	require.Contains(t, mustRun(t, "", "stats", "--json", "--schema", schema), `"queue":"email","pending":1,`)
	require.Contains(t, mustRun(t, "", "stats", "--json", "--schema", schema), `"paused":true`)
	require.Regexp(t, `email\s+1\s+0\s+0\s+0\s+0\s+\S+\s+paused`, mustRun(t, "", "stats", "--schema", schema))

	w := startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "off", "--queues", "email,ticks",
		"--handler", "mail=exec:true", "--handler", "tick=exec:true",
		"--periodic", `@every 200ms tick {"a":1}`, "--periodic-queue", "ticks")
	waitFor(t, "three periodic jobs run", func() bool { return count(`kind = 'tick' AND state = 'succeeded'`) >= 3 })
	require.Equal(t, 1, count(`kind = 'mail' AND state = 'pending'`), "the paused queue's job ran")
	require.Equal(t, 0, count(`kind = 'tick' AND (queue <> 'ticks' OR payload <> '{"a":1}')`))

	out = mustRun(t, "", "periodic", "list", "--json", "--schema", schema)
	var pl struct {
		Schedules []struct {
			Name, Spec, Kind, Queue string
			LastSlot                *string `json:"last_slot"`
			NextSlot                *string `json:"next_slot"`
		} `json:"schedules"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &pl), out)
	require.Len(t, pl.Schedules, 1)
	s := pl.Schedules[0]
	require.Equal(t, []string{"tick", "@every 200ms", "tick", "ticks"}, []string{s.Name, s.Spec, s.Kind, s.Queue})
	require.NotNil(t, s.LastSlot)
	require.NotNil(t, s.NextSlot)
	require.Regexp(t, `tick\s+@every 200ms\s+tick\s+ticks\s+\S+Z\s+\S+Z`, mustRun(t, "", "periodic", "list", "--schema", schema))

	require.Equal(t, "queue email resumed\n", mustRun(t, "", "queues", "resume", "email", "--schema", schema))
	waitState(t, schema, id, "succeeded")
	w.signal(syscall.SIGTERM)
	require.Equal(t, 0, w.wait())
}

// Bad input is a usage error (exit 2) before anything is written.
func TestQueuesAndPeriodicBadInput(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	for _, args := range [][]string{
		{"queues"},
		{"queues", "stop", "email"},
		{"queues", "pause"},
		{"queues", "pause", "Bad Queue"},
		{"periodic", "show"},
		{"worker", "--handler", "t=exec:true", "--periodic", "tick"},
		{"worker", "--handler", "t=exec:true", "--periodic", "61 * * * * tick"},
		{"worker", "--handler", "t=exec:true", "--periodic", "@every 1ms tick"},
		{"worker", "--handler", "t=exec:true", "--periodic", "@hourly tick {nope}"},
	} {
		r := pgwake(t, "", append(args, "--schema", schema)...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
	}
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM `+sqlident.Quote(schema, "paused_queues")+`) + (SELECT count(*) FROM `+sqlident.Quote(schema, "periodic")+`)`).Scan(&n))
	require.Zero(t, n)
}
