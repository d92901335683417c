package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// Every state change the SQL writes (the Go client's statements and the SQL
// API's functions, in held and leased mode) is a row of the transition
// table, and every row of the table is written by some path: replaying each
// job's events through queue.Next ends in the state of its row.
func TestSQLWritesOnlyTableTransitions(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	snoozed := map[int64]bool{}
	h := func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
		var p struct{ Do string }
		if err := json.Unmarshal(j.Payload, &p); err != nil {
			return err
		}
		switch p.Do {
		case "fail":
			return errors.New("fails")
		case "cancel":
			return queue.Cancel(errors.New("cancelled by its handler"))
		case "snooze":
			mu.Lock()
			defer mu.Unlock()
			if !snoozed[j.ID] {
				snoozed[j.ID] = true
				return queue.Snooze(10 * time.Millisecond)
			}
		}
		return nil
	}
	cfg := queue.Config{
		Queues:      map[string]queue.QueueConfig{"default": {}},
		Backoff:     func(int) time.Duration { return 10 * time.Millisecond },
		Handlers:    map[string]queue.Handler{"held": queue.HandlerFunc(h), "leased": queue.HandlerFunc(h)},
		LeasedKinds: []string{"leased"},
	}
	e := newEnv(t, cfg)
	e.run()
	ctx := context.Background()
	var failed []int64
	for _, kind := range []string{"held", "leased"} {
		for _, do := range []string{"ok", "fail", "cancel", "snooze"} {
			r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: kind, Payload: map[string]string{"do": do}, MaxAttempts: 2})
			require.NoError(t, err)
			if do == "fail" {
				failed = append(failed, r.ID)
			}
		}
	}
	// The SQL API's cancel of a pending job.
	var later int64
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT `+e.table("enqueue")+`('held', '{}', delay => interval '1 hour')`).Scan(&later))
	var ok bool
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT `+e.table("cancel")+`($1)`, later).Scan(&ok))
	require.True(t, ok)
	waitFor(t, 30*time.Second, "failed jobs", func() bool { return e.count(`state = 'failed'`) == len(failed) })
	for _, id := range failed {
		require.NoError(t, e.c.Retry(ctx, id))
	}
	waitFor(t, 30*time.Second, "every job finished", func() bool {
		return e.count(`finished_at IS NULL`) == 0 && e.count(`state = 'failed' AND attempts = 3`) == len(failed)
	})

	type pair struct {
		from queue.JobState
		ev   queue.EventType
	}
	seen := map[pair]bool{}
	cur := map[int64]queue.JobState{}
	rows, err := e.pool.Query(ctx, `SELECT job_id, type FROM `+e.table("events")+` ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var typ queue.EventType
		require.NoError(t, rows.Scan(&id, &typ))
		from := cur[id]
		next, ok := queue.Next(from, typ)
		require.True(t, ok, "job %d: %s after %q is not in the transition table", id, typ, from)
		seen[pair{from, typ}] = true
		cur[id] = next
	}
	require.NoError(t, rows.Err())
	rows, err = e.pool.Query(ctx, `SELECT id, state FROM `+e.table("jobs"))
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		var id int64
		var state queue.JobState
		require.NoError(t, rows.Scan(&id, &state))
		require.Equal(t, state, cur[id], "job %d: the events' state and the row's", id)
		n++
	}
	require.NoError(t, rows.Err())
	require.Len(t, cur, n)
	for _, tr := range queue.Transitions() {
		froms := tr.From
		if froms == nil {
			froms = []queue.JobState{""}
		}
		for _, f := range froms {
			require.True(t, seen[pair{f, tr.Event}], "no path wrote %s from %q: the table has a transition the SQL never writes", tr.Event, f)
		}
	}
}

func TestNextFollowsTheTable(t *testing.T) {
	t.Parallel()
	for _, tr := range queue.Transitions() {
		to, ok := queue.StateAfter(tr.Event)
		require.True(t, ok)
		require.Equal(t, tr.To, to)
		for _, s := range queue.States() {
			got, ok := queue.Next(s, tr.Event)
			require.Equal(t, slices.Contains(tr.From, s), ok, "%s from %s", tr.Event, s)
			if ok {
				require.Equal(t, tr.To, got)
			}
		}
	}
	_, ok := queue.Next(queue.StateSucceeded, queue.EventRetried)
	require.False(t, ok, "only a failed job is retried")
	_, ok = queue.StateAfter("exploded")
	require.False(t, ok)
}

// stateDiagram is the mermaid diagram of the transition table, as
// docs/states.md shows it.
func stateDiagram() string {
	var b strings.Builder
	b.WriteString("stateDiagram-v2\n")
	for _, tr := range queue.Transitions() {
		if tr.From == nil {
			fmt.Fprintf(&b, "    [*] --> %s: %s\n", tr.To, tr.Event)
			continue
		}
		for _, f := range tr.From {
			fmt.Fprintf(&b, "    %s --> %s: %s\n", f, tr.To, tr.Event)
		}
	}
	for _, s := range queue.States() {
		if s.Finished() {
			fmt.Fprintf(&b, "    %s --> [*]\n", s)
		}
	}
	return b.String()
}

// docs/states.md shows the transition table's diagram as the code has it.
func TestStatesDocMatchesTable(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/states.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)```mermaid\n(.*?)```").FindSubmatch(doc)
	require.NotNil(t, m, "docs/states.md has a mermaid block")
	require.Equal(t, stateDiagram(), string(m[1]), "docs/states.md's diagram differs from queue.Transitions(); the want value is the diagram to paste")
	for _, tr := range queue.Transitions() {
		require.Contains(t, string(doc), "`"+string(tr.Event)+"`", "docs/states.md describes every event")
	}
}
