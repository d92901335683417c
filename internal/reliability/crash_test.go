package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/queue"
)

// recordingPublisher is a Watermill publisher that keeps every event it is
// given, in order, after an optional delay per message (a slow broker).
type recordingPublisher struct {
	delay time.Duration
	mu    sync.Mutex
	got   []events.Event
	lsns  []pglogrepl.LSN // commit LSN of each of got
	bad   int
}

func (p *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if p.delay > 0 {
			time.Sleep(p.delay)
		}
		e, err := events.Decode(m.Payload)
		lsn, lerr := events.MessageLSN(m)
		p.mu.Lock()
		if err != nil || lerr != nil {
			p.bad++
		} else {
			p.got = append(p.got, e)
			p.lsns = append(p.lsns, lsn)
		}
		p.mu.Unlock()
	}
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) snapshot() []events.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]events.Event(nil), p.got...)
}

func (p *recordingPublisher) lsnsSnapshot() []pglogrepl.LSN {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]pglogrepl.LSN(nil), p.lsns...)
}

func (p *recordingPublisher) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.got)
}

// crashMark is what the stream had published and acknowledged when the
// server crashed.
type crashMark struct {
	published int
	acked     pglogrepl.LSN
}

const (
	crashHeldKind   = "crash_held"
	crashLeasedKind = "crash_leased"
	crashTickKind   = "crash_tick"
	// Quiet kinds do not touch their tx: a held batch of them commits
	// without waiting for the WAL flush, leased ones are grouped.
	crashQuietHeldKind   = "crash_quiet_held"
	crashQuietLeasedKind = "crash_quiet_leased"
)

// quietHandler works for up to hold and succeeds without touching its tx.
func quietHandler(hold time.Duration, trig *crashTrigger) queue.Handler {
	return queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, j *queue.Job) error {
		trig.ran(j.ID)
		trig.at(j.Kind, "start")
		t := time.NewTimer(rand.N(hold))
		defer t.Stop()
		select {
		case <-t.C:
			trig.at(j.Kind, "end")
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// crashTrigger lets the test crash the server at a chosen point of a
// handler: armed with a kind and a phase ("start": the handler begins,
// "end": it returns nil, its completion about to commit), the next such
// handler signals fire.
type crashTrigger struct {
	mu    sync.Mutex
	kind  string
	phase string
	fire  chan struct{}
	runs  sync.Map // job id -> *atomic.Int64, handler runs
}

func (c *crashTrigger) arm(kind, phase string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kind, c.phase, c.fire = kind, phase, make(chan struct{})
	return c.fire
}

func (c *crashTrigger) at(kind, phase string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fire != nil && c.kind == kind && c.phase == phase {
		close(c.fire)
		c.fire = nil
	}
}

func (c *crashTrigger) ran(id int64) {
	v, _ := c.runs.LoadOrStore(id, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// crashHandler writes the job's effect through its tx (held: the claim
// transaction; leased: the completion's), after up to hold of work; jobs
// whose key ends in 3 fail their first attempt after the write.
func crashHandler(schema string, hold time.Duration, trig *crashTrigger) queue.Handler {
	insert := `INSERT INTO ` + sqlident.Quote(schema, effectsTable) + ` (job_id, attempt, unique_key) VALUES ($1, $2, $3)`
	return queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
		trig.ran(j.ID)
		trig.at(j.Kind, "start")
		if hold > 0 {
			t := time.NewTimer(rand.N(hold))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		key := j.UniqueKey
		if key == "" {
			key = fmt.Sprintf("tick-%d", j.ID)
		}
		if _, err := tx.Exec(ctx, insert, j.ID, j.Attempt, key); err != nil {
			return err
		}
		if key[len(key)-1] == '3' && j.Attempt == 1 {
			return errors.New("planned failure")
		}
		trig.at(j.Kind, "end")
		return nil
	})
}

// TestDatabaseCrashUnderFullLoad crashes PostgreSQL (pg_ctl restart -m
// immediate: crash recovery, WAL replay) twice while producers enqueue,
// held and leased workers run jobs, a periodic schedule fires and an
// events stream relays every event to a (slow) publisher. Afterwards:
// every acknowledged enqueue ended succeeded with exactly one effect, from
// its last attempt; no job is left running or pending; every event row
// reached the publisher, in order per job (duplicates only as replays of a
// job's earlier events); nothing reached it that is not in the table; and
// events.Verify is clean.
func TestDatabaseCrashUnderFullLoad(t *testing.T) {
	if full() {
		t.Run("anywhere", func(t *testing.T) { crashUnderLoad(t, 0, [2]crashPoint{}) })
	}
	t.Run("leased_claim_and_held_commit", func(t *testing.T) {
		crashUnderLoad(t, 0, [2]crashPoint{{crashLeasedKind, "start"}, {crashHeldKind, "end"}})
	})
	t.Run("quiet_batches_stream_behind", func(t *testing.T) {
		crashUnderLoad(t, time.Millisecond, [2]crashPoint{{crashQuietHeldKind, "end"}, {crashQuietLeasedKind, "end"}})
	})
}

// crashPoint is where a crash lands: a kind and a handler phase; "" for
// wherever the load is at that moment.
type crashPoint struct{ kind, phase string }

func crashUnderLoad(t *testing.T, publishDelay time.Duration, points [2]crashPoint) {
	w := newWorld(t, true)
	trig := &crashTrigger{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The stream, started first so its slot sees every event.
	pub := &recordingPublisher{delay: publishDelay}
	slot := fmt.Sprintf("crash_%d", rand.Int64N(1<<40))
	st, err := events.New(w.pool("pgwake_stream", 4), events.Config{
		Schema: w.schema, Slot: slot, Publisher: pub, MaxBackoff: time.Second,
		StatusInterval: time.Second,
		Logger:         zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), // shown when the test fails
	})
	require.NoError(t, err)
	stopStream := pgtest.RunInBackground(t, "stream", st.Run)
	deadline := time.Now().Add(time.Minute)
	for w.count(`SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot) == 0 {
		require.True(t, time.Now().Before(deadline), "slot not created")
		time.Sleep(20 * time.Millisecond)
	}

	// Two worker clients: held, leased, and the periodic schedule.
	var stopWorkers []func()
	for range 2 {
		pool := w.pool(appWorker, 12)
		c, err := queue.New(pool, queue.Config{
			Schema: w.schema,
			Queues: map[string]queue.QueueConfig{workQueue: {MaxWorkers: 6}},
			Handlers: map[string]queue.Handler{
				crashHeldKind:        crashHandler(w.schema, 5*time.Millisecond, trig),
				crashLeasedKind:      crashHandler(w.schema, 200*time.Millisecond, trig),
				crashTickKind:        crashHandler(w.schema, 0, trig),
				crashQuietHeldKind:   quietHandler(2*time.Millisecond, trig),
				crashQuietLeasedKind: quietHandler(100*time.Millisecond, trig),
			},
			LeasedKinds:     []string{crashLeasedKind, crashQuietLeasedKind},
			LeaseDuration:   3 * time.Second,
			PollInterval:    500 * time.Millisecond,
			JobTimeout:      time.Minute,
			ShutdownTimeout: 10 * time.Second,
			Backoff:         func(int) time.Duration { return 20 * time.Millisecond },
			Periodic: []queue.PeriodicJob{{
				Spec: "@every 250ms", Job: queue.NewJob{Kind: crashTickKind, MaxAttempts: 50},
			}},
		})
		require.NoError(t, err)
		stopWorkers = append(stopWorkers, pgtest.RunInBackground(t, "worker", c.Run))
	}

	// Producers: acknowledged keys are recorded.
	prodPool := w.pool(appProducer, 6)
	prod, err := queue.New(prodPool, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	var ackMu sync.Mutex
	acked := map[string]bool{}
	var enqErrors atomic.Int64
	const loadFor = 10 * time.Second
	var pwg sync.WaitGroup
	loadEnd := time.Now().Add(loadFor)
	for p := range 3 {
		pwg.Go(func() {
			for i := 0; time.Now().Before(loadEnd); i++ {
				kind, prefix := crashHeldKind, "h"
				switch i % 6 {
				case 0, 3:
					kind, prefix = crashLeasedKind, "l"
				case 1:
					kind, prefix = crashQuietHeldKind, "qh"
				case 2:
					kind, prefix = crashQuietLeasedKind, "ql"
				}
				key := fmt.Sprintf("%s-%d-%d", prefix, p, i)
				job := queue.NewJob{Kind: kind, UniqueKey: key, UniqueHold: queue.UniqueHoldSucceeded, MaxAttempts: 50}
				ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := prod.Enqueue(ectx, job)
				ecancel()
				if err == nil {
					ackMu.Lock()
					acked[key] = true
					ackMu.Unlock()
				} else {
					enqErrors.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}

	// Two crashes, a few seconds apart.
	var crashes []string
	var marks []crashMark
	for k, at := range []time.Duration{3 * time.Second, 7 * time.Second} {
		time.Sleep(time.Until(loadEnd.Add(-loadFor + at)))
		how := "pg_ctl"
		// Only an upper bound of what was acknowledged before the crash can
		// be read without racing the crash: marks are taken before it.
		marks = append(marks, crashMark{published: pub.len(), acked: st.Acked()})
		var running, lagBytes int
		_ = w.admin.QueryRow(ctx, `SELECT count(*) FROM `+w.table("jobs")+` WHERE state = 'running'`).Scan(&running)
		_ = w.admin.QueryRow(ctx, `SELECT coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::int, 0) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lagBytes)
		if pt := points[k]; pt.kind != "" {
			select {
			case <-trig.arm(pt.kind, pt.phase):
				// Crash at once: SIGQUIT is what pg_ctl stop -m immediate
				// sends the postmaster, without pg_ctl's start-up time.
				pid, err := w.cluster.PostmasterPID()
				require.NoError(t, err)
				require.NoError(t, syscall.Kill(pid, syscall.SIGQUIT))
				how = pt.kind + "@" + pt.phase
			case <-time.After(5 * time.Second):
				trig.arm("", "")
				how = "pg_ctl(" + pt.kind + "@" + pt.phase + " not reached)"
			}
		}
		begin := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
		require.NoError(t, w.cluster.Restart(rctx, "immediate"))
		rcancel()
		crashes = append(crashes, fmt.Sprintf("crash(%s running=%d slot_lag=%dB took=%s)", how, running, lagBytes, time.Since(begin).Round(time.Millisecond)))
	}
	pwg.Wait()
	recovered := time.Now()

	// Everything settles: every job final but periodic ones not due yet
	// (enqueued ahead), none running; then the workers stop and the stream
	// catches up with the table.
	stuck := `SELECT count(*) FROM ` + w.table("jobs") + ` WHERE state = 'running'
		OR (state = 'pending' AND (kind <> $1 OR run_after < now() - interval '3 seconds'))`
	deadline = time.Now().Add(3 * time.Minute)
	for w.count(stuck, crashTickKind) > 0 {
		if time.Now().After(deadline) {
			t.Errorf("jobs not final 3m after the load")
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	settle := time.Since(recovered)
	for _, stop := range stopWorkers {
		stop()
	}
	stoppedAt := w.dbNow()
	for {
		rows := w.count(`SELECT count(*) FROM ` + w.table("events"))
		have := map[int64]bool{}
		for _, e := range pub.snapshot() {
			have[e.ID] = true
		}
		if len(have) >= rows {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d of %d events published 3m after the load", len(have), rows)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopStream()

	// Jobs and effects.
	type jobRow struct {
		id       int64
		key      string
		kind     string
		state    string
		attempts int
		effects  []int
		runAfter time.Time
	}
	jobs := map[int64]*jobRow{}
	byKey := map[string][]*jobRow{}
	rows, err := w.admin.Query(ctx, `SELECT id, coalesce(unique_key, ''), kind, state, attempts, run_after FROM `+w.table("jobs"))
	require.NoError(t, err)
	for rows.Next() {
		j := &jobRow{}
		require.NoError(t, rows.Scan(&j.id, &j.key, &j.kind, &j.state, &j.attempts, &j.runAfter))
		jobs[j.id] = j
		byKey[j.key] = append(byKey[j.key], j)
	}
	require.NoError(t, rows.Err())
	rows, err = w.admin.Query(ctx, `SELECT job_id, attempt FROM `+w.table(effectsTable))
	require.NoError(t, err)
	orphanFX := 0
	for rows.Next() {
		var id int64
		var a int
		require.NoError(t, rows.Scan(&id, &a))
		if j := jobs[id]; j != nil {
			j.effects = append(j.effects, a)
		} else {
			orphanFX++
		}
	}
	require.NoError(t, rows.Err())
	var problems []string
	problem := func(f string, a ...any) {
		if len(problems) < 30 {
			problems = append(problems, fmt.Sprintf(f, a...))
		}
	}
	if orphanFX > 0 {
		problem("%d effects of jobs that do not exist", orphanFX)
	}
	lost, dupJobs, dupFX, ticks, uncounted := 0, 0, 0, 0, 0
	for key := range acked {
		js := byKey[key]
		if len(js) == 0 {
			lost++
			problem("acknowledged %s has no job", key)
		}
		if len(js) > 1 {
			dupJobs++
			problem("%s held by %d jobs", key, len(js))
		}
	}
	slots := map[time.Time]int{}
	var lastSlot time.Time
	for _, j := range jobs {
		if j.kind == crashTickKind {
			ticks++
			slots[j.runAfter]++
			if slots[j.runAfter] == 2 {
				problem("periodic slot %s has two jobs", j.runAfter)
			}
			if j.runAfter.After(lastSlot) {
				lastSlot = j.runAfter
			}
		}
		if v, ok := trig.runs.Load(j.id); ok && j.state == "succeeded" {
			if n := int(v.(*atomic.Int64).Load()); n > j.attempts {
				uncounted += n - j.attempts // runs a crash kept from counting (documented)
			}
		}
		if j.state == "pending" && j.kind == crashTickKind && j.runAfter.After(stoppedAt.Add(-3*time.Second)) {
			continue // enqueued ahead, not due before the workers stopped
		}
		if j.state != "succeeded" {
			problem("job %d (%s, %s) ended %s", j.id, j.key, j.kind, j.state)
			continue
		}
		quiet := j.kind == crashQuietHeldKind || j.kind == crashQuietLeasedKind
		switch {
		case quiet && len(j.effects) == 0:
		case quiet:
			problem("quiet job %d has effects", j.id)
		case len(j.effects) == 0:
			problem("job %d (%s, %s) succeeded without its effect", j.id, j.key, j.kind)
		case len(j.effects) > 1:
			dupFX++
			problem("job %d (%s, %s) has %d effects %v", j.id, j.key, j.kind, len(j.effects), j.effects)
		case j.effects[0] != j.attempts:
			problem("job %d (%s, %s) succeeded after %d attempts with the effect of attempt %d", j.id, j.key, j.kind, j.attempts, j.effects[0])
		}
	}

	// Events: the table against what the publisher received.
	type evRow struct {
		jobID   int64
		typ     string
		attempt int
	}
	table := map[int64]evRow{}
	perJob := map[int64][]int64{}
	rows, err = w.admin.Query(ctx, `SELECT id, job_id, type, attempt FROM `+w.table("events")+` ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var e evRow
		require.NoError(t, rows.Scan(&id, &e.jobID, &e.typ, &e.attempt))
		table[id] = e
		perJob[e.jobID] = append(perJob[e.jobID], id)
	}
	require.NoError(t, rows.Err())
	got := pub.snapshot()
	seen := map[int64]int{}
	phantom, dups := 0, 0
	recvPerJob := map[int64][]int64{}
	for _, e := range got {
		seen[e.ID]++
		if seen[e.ID] > 1 {
			dups++
		}
		te, ok := table[e.ID]
		if !ok {
			phantom++
			problem("published event %d (job %d %s attempt %d) is not in the table", e.ID, e.JobID, e.Type, e.Attempt)
			continue
		}
		if te.jobID != e.JobID || te.typ != string(e.Type) || te.attempt != e.Attempt {
			problem("published event %d differs from its row", e.ID)
		}
		recvPerJob[e.JobID] = append(recvPerJob[e.JobID], e.ID)
	}
	missing := 0
	for id := range table {
		if seen[id] == 0 {
			missing++
			problem("event %d (job %d %s) never published", id, table[id].jobID, table[id].typ)
		}
	}
	// Acknowledged events are not published again by the stream that
	// acknowledged them: after a crash the server may resume the slot from
	// an older position (its confirmed position is written to disk at
	// checkpoints), but the stream knows what it acknowledged.
	lsns := pub.lsnsSnapshot()
	reacked := 0
	for _, m := range marks {
		before := map[int64]bool{}
		for _, e := range got[:m.published] {
			before[e.ID] = true
		}
		for k := m.published; k < len(got); k++ {
			if before[got[k].ID] && lsns[k] < m.acked {
				reacked++
			}
		}
	}
	if reacked > 0 {
		problem("%d events acknowledged before a crash were published again after it", reacked)
	}
	// In order per job: a consumer that drops any event whose id is not
	// greater than the last it applied for that job gets every event of the
	// job, in id order.
	disorder := 0
	for job, want := range perJob {
		var applied []int64
		last := int64(0)
		for _, id := range recvPerJob[job] {
			if id > last {
				applied = append(applied, id)
				last = id
			}
		}
		if fmt.Sprint(applied) != fmt.Sprint(want) {
			disorder++
			problem("job %d: table has events %v, an in-order consumer applies %v (received %v)", job, want, applied, recvPerJob[job])
		}
	}
	mm, err := events.Verify(ctx, w.admin, w.schema)
	require.NoError(t, err)
	for _, m := range mm {
		problem("verify: job %d: %s", m.JobID, m.Problem)
	}
	sort.Strings(problems)
	t.Logf("RESULT %s: acked=%d jobs=%d ticks=%d lost=%d dup_jobs=%d dup_effects=%d events=%d published=%d duplicates=%d missing=%d phantom=%d disorder=%d verify=%d enqueue_errors=%d uncounted_runs=%d republished_after_ack=%d settle=%s %v",
		t.Name(), len(acked), len(jobs), ticks, lost, dupJobs, dupFX, len(table), len(got), dups, missing, phantom, disorder, len(mm),
		enqErrors.Load(), uncounted, reacked, settle.Round(time.Millisecond), crashes)
	for _, p := range problems {
		t.Errorf("invariant violated: %s", p)
	}
	require.Positive(t, ticks, "no periodic job ran")
	require.True(t, lastSlot.After(stoppedAt.Add(-5*time.Second)), "the schedule did not resume after the crashes: last slot %s, workers stopped at %s", lastSlot, stoppedAt)
}
