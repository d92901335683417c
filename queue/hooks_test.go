package queue_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

type ctxKey struct{}

// Hooks: BeforeEnqueue sets metadata on a copy of the caller's jobs and
// sees the call's error; Work gives the handler its context and sees the
// handler's error, a panic included. WorkOne runs one job in the caller's
// goroutine.
func TestHooksAndMetadata(t *testing.T) {
	t.Parallel()
	var enqueueErrs, workErrs []error
	var seen []map[string]string
	hooks := queue.Hooks{
		BeforeEnqueue: func(ctx context.Context, jobs []queue.NewJob) func(error) {
			for i := range jobs {
				m := map[string]string{"from": "hook"}
				for k, v := range jobs[i].Metadata {
					m[k] = v
				}
				jobs[i].Metadata = m
			}
			return func(err error) { enqueueErrs = append(enqueueErrs, err) }
		},
		Work: func(ctx context.Context, j *queue.Job) (context.Context, func(error)) {
			return context.WithValue(ctx, ctxKey{}, j.ID), func(err error) { workErrs = append(workErrs, err) }
		},
	}
	h := queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, j *queue.Job) error {
		require.Equal(t, j.ID, ctx.Value(ctxKey{}), "the handler gets Work's context")
		seen = append(seen, j.Metadata)
		if j.Kind == "boom" {
			panic("boom")
		}
		return nil
	})
	e := newEnv(t, queue.Config{Hooks: hooks, Handlers: map[string]queue.Handler{"ok": h, "boom": h}})
	ctx := context.Background()
	mine := []queue.NewJob{{Kind: "ok", Metadata: map[string]string{"tenant": "7"}}, {Kind: "boom"}}
	_, err := e.c.EnqueueMany(ctx, mine)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"tenant": "7"}, mine[0].Metadata, "the caller's jobs are not changed")
	_, err = e.c.Enqueue(ctx, queue.NewJob{Kind: "Bad Kind"})
	require.ErrorIs(t, err, queue.ErrInvalidKind)
	require.Len(t, enqueueErrs, 2)
	require.NoError(t, enqueueErrs[0])
	require.ErrorIs(t, enqueueErrs[1], queue.ErrInvalidKind, "done sees the call's error")

	for range 2 {
		_, ok, err := e.c.WorkOne(ctx)
		require.NoError(t, err)
		require.True(t, ok)
	}
	_, ok, err := e.c.WorkOne(ctx)
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, []map[string]string{{"from": "hook", "tenant": "7"}, {"from": "hook"}}, seen)
	require.Len(t, workErrs, 2)
	require.NoError(t, workErrs[0])
	var pe *queue.PanicError
	require.True(t, errors.As(workErrs[1], &pe), "done sees a panic as *PanicError: %v", workErrs[1])
}

// Claimed and Complete, in held and leased mode: one Claimed call per claim
// with the claimed job and a claim start before it; one Complete per attempt
// whose done gets the state the write recorded (succeeded, failed for good,
// cancelled, pending for a snooze), and, in held mode, a handler that ends the claim transaction
// gets its failure recorded on its own, still one Complete.
func TestHooksClaimedAndComplete(t *testing.T) {
	t.Parallel()
	for _, leased := range []bool{false, true} {
		t.Run(map[bool]string{false: "held", true: "leased"}[leased], func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			claimed := map[int64]int{}
			states := map[int64][]queue.JobState{}
			hooks := queue.Hooks{
				Claimed: func(ctx context.Context, jobs []*queue.Job, began time.Time) {
					mu.Lock()
					defer mu.Unlock()
					require.Len(t, jobs, 1)
					require.False(t, began.After(time.Now()))
					claimed[jobs[0].ID]++
				},
				Complete: func(ctx context.Context, j *queue.Job) func(queue.JobState, error) {
					return func(s queue.JobState, err error) {
						mu.Lock()
						defer mu.Unlock()
						require.NoError(t, err)
						states[j.ID] = append(states[j.ID], s)
					}
				},
			}
			h := queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				switch j.Kind {
				case "fail":
					return errors.New("no")
				case "cancel":
					return queue.Cancel(errors.New("not wanted"))
				case "snooze":
					return queue.Snooze(time.Hour)
				case "ender":
					return tx.Commit(ctx)
				}
				return nil
			})
			kinds := []string{"ok", "fail", "cancel", "snooze"}
			cfg := queue.Config{Hooks: hooks, Handlers: map[string]queue.Handler{"ok": h, "fail": h, "cancel": h, "snooze": h, "ender": h}}
			want := map[string]queue.JobState{"ok": queue.StateSucceeded, "fail": queue.StateFailed, "cancel": queue.StateCancelled, "snooze": queue.StatePending}
			if leased {
				cfg.LeasedKinds = kinds
			} else {
				kinds = append(kinds, "ender")
				want["ender"] = queue.StateFailed
			}
			e := newEnv(t, cfg)
			ctx := context.Background()
			ids := map[string]int64{}
			for _, k := range kinds {
				res, err := e.c.Enqueue(ctx, queue.NewJob{Kind: k, MaxAttempts: 1})
				require.NoError(t, err)
				ids[k] = res.ID
			}
			for range kinds {
				_, ok, err := e.c.WorkOne(ctx)
				require.NoError(t, err)
				require.True(t, ok)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, k := range kinds {
				require.Equal(t, 1, claimed[ids[k]], k)
				require.Equal(t, []queue.JobState{want[k]}, states[ids[k]], k)
			}
		})
	}
}

// A held batch whose COMMIT fails: the completion that was under way ends
// with the commit's error and records no state; the failure then recorded
// on its own is a second completion, which records the retry.
func TestCompleteHookOnCommitFailure(t *testing.T) {
	t.Parallel()
	type done struct {
		state queue.JobState
		err   error
	}
	var mu sync.Mutex
	var dones []done
	var schema string
	e := newEnv(t, queue.Config{
		Hooks: queue.Hooks{Complete: func(ctx context.Context, j *queue.Job) func(queue.JobState, error) {
			return func(s queue.JobState, err error) {
				mu.Lock()
				defer mu.Unlock()
				dones = append(dones, done{s, err})
			}
		}},
		Handlers: map[string]queue.Handler{"w": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.deferred (k) VALUES (1)`) // fails at COMMIT
			return err
		})},
	})
	schema = e.schema
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `CREATE TABLE `+e.table("deferred")+` (k int UNIQUE DEFERRABLE INITIALLY DEFERRED); INSERT INTO `+e.table("deferred")+` VALUES (1)`)
	require.NoError(t, err)
	res, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "w", MaxAttempts: 2})
	require.NoError(t, err)
	id, ok, err := e.c.WorkOne(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, res.ID, id)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, dones, 2)
	require.Empty(t, dones[0].state)
	require.ErrorContains(t, dones[0].err, "commit failed")
	require.Equal(t, done{queue.StatePending, nil}, dones[1])
}

// A leased completion that finds its lease taken (here: another worker's
// name written over it while the handler ran) records nothing: Complete's
// done gets no state and ErrLeaseLost.
func TestCompleteHookOnLeaseLost(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var states []queue.JobState
	var errs []error
	var e *env
	e = newEnv(t, queue.Config{
		LeasedKinds: []string{"l"},
		Hooks: queue.Hooks{Complete: func(ctx context.Context, j *queue.Job) func(queue.JobState, error) {
			return func(s queue.JobState, err error) {
				mu.Lock()
				defer mu.Unlock()
				states, errs = append(states, s), append(errs, err)
			}
		}},
		Handlers: map[string]queue.Handler{"l": queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, j *queue.Job) error {
			_, err := e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET leased_by = 'another worker' WHERE id = $1`, j.ID)
			return err
		})},
	})
	ctx := context.Background()
	_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "l"})
	require.NoError(t, err)
	_, ok, err := e.c.WorkOne(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []queue.JobState{""}, states)
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], queue.ErrLeaseLost)
}

// A panicking Claimed hook, Complete hook or Complete done function is
// logged and the attempt goes on: before, Claimed's panic under WorkOne
// left the claim's connection taken and the job's row locked for good, and
// Complete's ended the worker process.
func TestHookPanicsAreContained(t *testing.T) {
	t.Parallel()
	ok := queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error { return nil })
	t.Run("Claimed under WorkOne", func(t *testing.T) {
		t.Parallel()
		e := newEnvOwnPool(t, 4, queue.Config{AllowSmallPool: true,
			Handlers: map[string]queue.Handler{"k": ok},
			Hooks:    queue.Hooks{Claimed: func(context.Context, []*queue.Job, time.Time) { panic("hook bug") }},
		})
		ctx := context.Background()
		r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
		require.NoError(t, err)
		id, ran, err := e.c.WorkOne(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		require.Equal(t, r.ID, id)
		require.Equal(t, 1, e.count(`id = $1 AND state = 'succeeded'`, r.ID))
		require.Zero(t, e.pool.Stat().AcquiredConns(), "no connection left taken")
	})
	for _, inDone := range []bool{false, true} {
		t.Run(map[bool]string{false: "Complete under Run", true: "Complete's done under Run"}[inDone], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, queue.Config{
				Queues:   map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
				Handlers: map[string]queue.Handler{"k": ok},
				Hooks: queue.Hooks{Complete: func(context.Context, *queue.Job) func(queue.JobState, error) {
					if !inDone {
						panic("hook bug")
					}
					return func(queue.JobState, error) { panic("done bug") }
				}},
			})
			e.run()
			ids := e.enqueueIDs(queue.NewJob{Kind: "k"}, queue.NewJob{Kind: "k"})
			waitFor(t, 20*time.Second, "both jobs succeeded", func() bool { return e.count(`id = ANY($1) AND state = 'succeeded'`, ids) == 2 })
		})
	}
}
