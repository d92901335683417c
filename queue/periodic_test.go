package queue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

const periodicEvery = 200 * time.Millisecond

func tickSchedule(skip bool) []queue.PeriodicJob {
	return []queue.PeriodicJob{{
		Spec:       "@every 200ms",
		Job:        queue.NewJob{Kind: "tick", Queue: "periodic", Payload: map[string]int{"n": 1}},
		SkipMissed: skip,
	}}
}

// slots returns the run_after of every tick job, in order.
func (e *env) slots() []time.Time {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT run_after FROM `+e.table("jobs")+` WHERE kind = 'tick' ORDER BY run_after`)
	require.NoError(e.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(e.t, err)
	return out
}

// periodicSlots is how many slots TestPeriodicOneJobPerSlotAcrossClients
// runs (12 s of 200 ms slots: the 60 slots, at test size).
const periodicSlots = 60

// Up to three clients run one schedule, started and stopped at random (at
// a random moment in a slot, once a slot, always at least one running),
// over 60 slots of 200 ms, while another client works the jobs: every slot
// gets exactly one job, no gap, no duplicate, and no job runs before its
// slot. The lateness (handler start minus slot) is logged, not asserted: a
// loaded machine must not fail a test; BenchmarkPeriodicLateness measures it
// (docs/periodic.md).
func TestPeriodicOneJobPerSlotAcrossClients(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := newEnv(t, queue.Config{})
	var work *env
	work = newEnvOn(t, base.pool, base.schema, queue.Config{
		Queues: map[string]queue.QueueConfig{"periodic": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"tick": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			return effect(ctx, tx, work.schema, j)
		})},
	})
	work.run()
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	var running []func()
	starts, stops := 0, 0
	start := func() {
		running = append(running, newEnvOn(t, work.pool, work.schema, queue.Config{Periodic: tickSchedule(false), PollInterval: time.Second}).run())
		starts++
	}
	start()
	ran := func() int { return work.countSQL(`SELECT count(*) FROM ` + work.table("effects")) }
	for n := 0; n < periodicSlots; n++ {
		waitFor(t, 10*time.Second, fmt.Sprintf("job %d run", n+1), func() bool { return ran() > n })
		<-time.After(time.Duration(rng.Int64N(int64(periodicEvery)))) // a random moment in the slot
		if len(running) == 1 || (len(running) < 3 && rng.IntN(2) == 0) {
			start()
			continue
		}
		i := rng.IntN(len(running))
		running[i]()
		running = append(running[:i], running[i+1:]...)
		stops++
	}
	for _, stop := range running {
		stop()
	}
	t.Logf("periodic: seed %d, %d client starts, %d stops", seed, starts, stops)
	require.GreaterOrEqual(t, stops, periodicSlots/4, "clients were stopped while the schedule ran")

	slots := work.slots()
	require.GreaterOrEqual(t, len(slots), periodicSlots)
	for i := 1; i < len(slots); i++ {
		require.Equal(t, periodicEvery, slots[i].Sub(slots[i-1]), "slot %d after %s: a gap or a duplicate", i, slots[i-1])
	}
	require.True(t, slots[0].Equal(slots[0].Truncate(periodicEvery)), "slots are multiples of the interval: %s", slots[0])

	// Lateness: handler start (the effect) minus the slot, for the jobs run.
	rows, err := work.pool.Query(ctx, `SELECT extract(epoch FROM e.at - j.run_after)::float8 * 1000
		FROM `+work.table("effects")+` e JOIN `+work.table("jobs")+` j ON j.id = e.job_id ORDER BY 1`)
	require.NoError(t, err)
	late, err := pgx.CollectRows(rows, pgx.RowTo[float64])
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(late), periodicSlots)
	sort.Float64s(late)
	p99 := late[min(len(late)-1, len(late)*99/100)]
	t.Logf("periodic: %d slots, one job each; lateness of %d run jobs: min %.1f ms, median %.1f ms, p99 %.1f ms, max %.1f ms",
		len(slots), len(late), late[0], late[len(late)/2], p99, late[len(late)-1])
	require.GreaterOrEqual(t, late[0], 0.0, "a job ran before its slot")
}

// A schedule whose slots passed while no client ran: the latest of them is
// enqueued once, however many clients start at once; SkipMissed skips them.
// Hourly, so that the next slot is far outside the lead: the test sees
// exactly the missed slot's job (or none).
func TestPeriodicMissedSlots(t *testing.T) {
	t.Parallel()
	for _, skip := range []bool{false, true} {
		name := map[bool]string{false: "run_once", true: "skip"}[skip]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, queue.Config{})
			hourly := []queue.PeriodicJob{{Spec: "@every 1h", Job: queue.NewJob{Kind: "tick", Queue: "periodic"}, SkipMissed: skip}}
			// The last slot enqueued was 3 hours ago: 3 slots passed since,
			// the latest at the start of this hour.
			var hour time.Time
			require.NoError(t, e.pool.QueryRow(ctx, `INSERT INTO `+e.table("periodic")+` (name, spec, kind, queue, last_slot)
				VALUES ('tick', '@every 1h', 'tick', 'periodic', date_trunc('hour', now()) - interval '3 hours')
				RETURNING date_trunc('hour', now())`).Scan(&hour))
			for range 3 {
				newEnvOn(t, e.pool, e.schema, queue.Config{Periodic: hourly}).run()
			}
			waitFor(t, 10*time.Second, "the missed slots accounted for", func() bool {
				return e.countSQL(`SELECT count(*) FROM `+e.table("periodic")+` WHERE last_slot >= $1`, hour) == 1
			})
			var end time.Time
			require.NoError(t, e.pool.QueryRow(ctx, `SELECT now() + interval '2 seconds'`).Scan(&end))
			if end.Truncate(time.Hour) != hour {
				t.Skip("the hour ended during the test")
			}
			slots := e.slots()
			if skip {
				require.Empty(t, slots, "skipped slots enqueued")
			} else {
				require.Len(t, slots, 1, "missed slots enqueued: %v", slots)
				require.True(t, slots[0].Equal(hour), "the latest missed slot runs, not %s", slots[0])
			}
			list, err := e.c.PeriodicSchedules(ctx)
			require.NoError(t, err)
			require.Len(t, list, 1)
			require.Equal(t, "tick", list[0].Name)
			require.Equal(t, "@every 1h", list[0].Spec)
			require.True(t, list[0].LastSlot.Equal(hour), "last slot %s", list[0].LastSlot)
			require.True(t, list[0].NextSlot.Equal(hour.Add(time.Hour)), "next slot %s", list[0].NextSlot)
		})
	}
}

// Bad schedules are refused by New, before anything is written.
func TestPeriodicConfigErrors(t *testing.T) {
	t.Parallel()
	pool := newEnv(t, queue.Config{}).pool
	job := queue.NewJob{Kind: "tick"}
	for name, p := range map[string][]queue.PeriodicJob{
		"bad spec":     {{Spec: "61 * * * *", Job: job}},
		"empty spec":   {{Job: job}},
		"short every":  {{Spec: "@every 1ms", Job: job}},
		"bad duration": {{Spec: "@every soon", Job: job}},
		"unique key":   {{Spec: "@hourly", Job: queue.NewJob{Kind: "tick", UniqueKey: "k"}}},
		"delay":        {{Spec: "@hourly", Job: queue.NewJob{Kind: "tick", Delay: time.Second}}},
		"run after":    {{Spec: "@hourly", Job: queue.NewJob{Kind: "tick", RunAfter: time.Now().Add(time.Hour)}}},
		"same name":    {{Spec: "@hourly", Job: job}, {Spec: "@daily", Job: job}},
	} {
		_, err := queue.New(pool, queue.Config{Periodic: p})
		require.ErrorIs(t, err, queue.ErrInvalidConfig, name)
		require.ErrorIs(t, err, queue.ErrInvalidPeriodic, name)
	}
	_, err := queue.New(pool, queue.Config{Periodic: []queue.PeriodicJob{{Spec: "@hourly", Job: queue.NewJob{Kind: "bad kind"}}}})
	require.ErrorIs(t, err, queue.ErrInvalidConfig)
	require.ErrorIs(t, err, queue.ErrInvalidKind)
	// Cron specs with and without seconds, descriptors and zones parse.
	for _, spec := range []string{"*/5 * * * *", "*/2 * * * * *", "@daily", "CRON_TZ=Europe/Paris 0 9 * * 1-5", "@every 1h"} {
		require.NoError(t, queue.ParseSpec(spec), spec)
	}
	require.True(t, errors.Is(queue.ParseSpec("* * *"), queue.ErrInvalidPeriodic))
}
