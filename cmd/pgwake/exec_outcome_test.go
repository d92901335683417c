package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// runAfterIn is how far in the future job id is due.
func runAfterIn(t *testing.T, schema string, id int64) time.Duration {
	t.Helper()
	var secs float64
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		`SELECT extract(epoch FROM run_after - now()) FROM `+sqlident.Quote(schema, "jobs")+` WHERE id = $1`, id).Scan(&secs))
	return time.Duration(secs * float64(time.Second))
}

func TestExecControlLines(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	snz := enqueueID(t, "", "--schema", schema, "--kind", "snz")
	cnl := enqueueID(t, "", "--schema", schema, "--kind", "cnl")
	ra := enqueueID(t, "", "--schema", schema, "--kind", "ra")
	bad := enqueueID(t, "", "--schema", schema, "--kind", "bad")
	last := enqueueID(t, "", "--schema", schema, "--kind", "last")
	startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "off",
		// Snooze wins over a failing exit status; no newline after it.
		"--handler", `snz=exec:printf '::pgwake snooze 1h'; exit 4`,
		"--handler", `cnl=exec:echo '::pgwake cancel not wanted any more'; exit 3`,
		"--handler", `ra=exec:echo '::pgwake retry-after 2h partner says wait'; exit 1`,
		"--handler", `bad=exec:echo '::pgwake frobnicate'`,
		"--handler", `last=exec:echo '::pgwake cancel first'; echo '::pgwake snooze 1h'`)

	waitState(t, schema, snz, "pending")
	waitFor(t, "the snooze", func() bool { return runAfterIn(t, schema, snz) > 50*time.Minute })
	require.Equal(t, 0, getJob(t, schema, snz).attempts, "a snooze does not count the attempt")

	j := waitState(t, schema, cnl, "cancelled")
	require.Equal(t, 1, j.attempts)
	require.Equal(t, "cancelled by its handler: not wanted any more", j.lastError)

	waitFor(t, "the retry-after", func() bool { return getJob(t, schema, ra).attempts == 1 })
	j = getJob(t, schema, ra)
	require.Equal(t, "pending", j.state)
	require.Equal(t, "partner says wait", j.lastError)
	in := runAfterIn(t, schema, ra)
	require.Greater(t, in, 110*time.Minute)
	require.Less(t, in, 121*time.Minute)

	waitFor(t, "the malformed control line's attempt", func() bool { return getJob(t, schema, bad).attempts == 1 })
	require.Contains(t, getJob(t, schema, bad).lastError, `malformed control line "frobnicate"`)

	waitFor(t, "the last control line to win", func() bool { return runAfterIn(t, schema, last) > 50*time.Minute })
	require.Equal(t, "pending", getJob(t, schema, last).state)

	var events []string
	rows, err := pgtest.Pool(t).Query(context.Background(),
		`SELECT type FROM `+sqlident.Quote(schema, "events")+` WHERE job_id = $1 ORDER BY id`, snz)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		events = append(events, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"enqueued", "snoozed"}, events)
}

// TestExecCancelOfARunningCommand: pgwake jobs cancel of a running exec job
// sends SIGTERM to the command's process group, then SIGKILL after
// --term-grace to a command that ignores it; either way the job ends
// cancelled, not retried. Both execution modes.
func TestExecCancelOfARunningCommand(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"held", "leased"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			schema := migrated(t)
			dir := t.TempDir()
			polite, stubborn := filepath.Join(dir, "polite"), filepath.Join(dir, "stubborn")
			args := []string{"worker", "--schema", schema, "--metrics-addr", "off", "--term-grace", "500ms",
				"--handler", fmt.Sprintf(`polite=exec:trap 'echo term > %s.term; exit 143' TERM; echo $$ > %s.pid; sleep 600 & wait`, polite, polite),
				"--handler", fmt.Sprintf(`stubborn=exec:trap '' TERM; echo $$ > %s.pid; sleep 600 & wait; sleep 600 & wait`, stubborn)}
			if mode == "leased" {
				args = append(args, "--leased", "polite", "--leased", "stubborn")
			}
			p := enqueueID(t, "", "--schema", schema, "--kind", "polite")
			s := enqueueID(t, "", "--schema", schema, "--kind", "stubborn")
			startPgwake(t, args...)

			pids := map[int64]int{}
			for id, base := range map[int64]string{p: polite, s: stubborn} {
				waitFor(t, base+" to start", func() bool {
					b, err := os.ReadFile(base + ".pid")
					if err != nil || !strings.HasSuffix(string(b), "\n") {
						return false
					}
					pids[id], err = strconv.Atoi(strings.TrimSpace(string(b)))
					return err == nil
				})
			}
			for _, id := range []int64{p, s} {
				start := time.Now()
				require.Equal(t, fmt.Sprintf("cancelled %d\n", id),
					mustRun(t, "", "jobs", "cancel", "--schema", schema, strconv.FormatInt(id, 10)))
				waitFor(t, "the command to end", func() bool { return processGone(pids[id]) })
				t.Logf("%s: job %d: command ended %s after jobs cancel started", mode, id, time.Since(start).Round(time.Millisecond))
				j := waitState(t, schema, id, "cancelled")
				require.Equal(t, 1, j.attempts)
			}
			b, err := os.ReadFile(polite + ".term")
			require.NoError(t, err, "the polite command got SIGTERM and ran its trap")
			require.Equal(t, "term\n", string(b))
			_, err = os.Stat(stubborn + ".term")
			require.True(t, os.IsNotExist(err))
		})
	}
}
