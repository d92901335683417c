package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgcluster"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// full reports whether the full sizes were asked for.
func full() bool { return os.Getenv("PGWAKE_RELIABILITY_FULL") == "1" }

// size picks the CI size or the full size.
func size(ci, fullSize int) int {
	if full() {
		return fullSize
	}
	return ci
}

// hangGuard is how long a run may take before the test calls it hung: a
// guard against hangs, not a speed requirement, so it is generous (the
// full size on a loaded machine takes minutes).
func hangGuard() time.Duration {
	if full() {
		return 30 * time.Minute
	}
	return 8 * time.Minute
}

// Application names of the connections a workload opens, so faults can
// pick them out in pg_stat_activity.
const (
	appWorker   = "pgwake_worker"
	appProducer = "pgwake_producer"
	appListener = "pgwake_listener" // notify.ApplicationName
	appAdmin    = "pgwake_reliability_admin"
)

// Job modes: what the handler does with a job.
const (
	modeOK          = "ok"
	modeFailFirst   = "fail_first"  // the first attempt fails after writing its effect
	modeFailAlways  = "fail_always" // every attempt fails; the job ends failed
	failAlwaysLimit = 2             // max attempts of fail_always jobs
	okMaxAttempts   = 50            // high: connection faults may fail attempts of ok jobs
	jobKind         = "work"        // the kind every workload job has
	keyPrefix       = "j-"          // unique keys are j-<index>
	effectsTable    = "effects"     // the handler's writes
	workQueue       = queue.DefaultQueue
)

// modeOf is job i's mode: 1 in 20 fails its first attempt, 1 in 100 always
// fails.
func modeOf(i int) string {
	switch {
	case i%100 == 13:
		return modeFailAlways
	case i%20 == 7:
		return modeFailFirst
	default:
		return modeOK
	}
}

func newJob(i int) queue.NewJob {
	mode := modeOf(i)
	ma := okMaxAttempts
	if mode == modeFailAlways {
		ma = failAlwaysLimit
	}
	return queue.NewJob{
		Kind:        jobKind,
		Payload:     map[string]any{"i": i, "mode": mode},
		UniqueKey:   fmt.Sprintf("%s%d", keyPrefix, i),
		MaxAttempts: ma,
	}
}

// world is a database, a migrated schema with an effects table and an admin
// pool for the checks.
type world struct {
	t       *testing.T
	url     string
	cluster *pgcluster.Cluster // nil when the server is not ours to restart
	admin   *pgxpool.Pool
	schema  string
}

// newWorld prepares a fresh schema. With ownCluster the world's server may
// be restarted or stopped: the test binary's cluster, or a private one when
// $TEST_DATABASE_URL points elsewhere.
func newWorld(t *testing.T, ownCluster bool) *world {
	t.Helper()
	w := &world{t: t, url: pgtest.URL(), cluster: pgtest.Cluster()}
	if ownCluster {
		w.cluster = pgtest.RestartableCluster(t)
		w.url = w.cluster.URL
	}
	w.admin = w.pool(appAdmin, 8)
	w.schema = pgtest.SchemaOn(t, w.admin)
	ctx := context.Background()
	_, err := migrations.Up(ctx, w.admin, w.schema)
	require.NoError(t, err)
	_, err = w.admin.Exec(ctx, `CREATE TABLE `+w.table(effectsTable)+` (
		job_id bigint NOT NULL, attempt int NOT NULL, unique_key text NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	return w
}

func (w *world) table(name string) string { return sqlident.Quote(w.schema, name) }

// pool opens a pool on the world's server whose sessions carry app as
// application_name; closed at cleanup.
func (w *world) pool(app string, maxConns int32) *pgxpool.Pool {
	return w.poolOn(w.url, app, maxConns)
}

func (w *world) poolOn(url, app string, maxConns int32) *pgxpool.Pool {
	w.t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(w.t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(w.t, err)
	w.t.Cleanup(p.Close)
	return p
}

// count runs a count query on the admin pool, retrying while the server is
// away (restart tests).
func (w *world) count(sql string, args ...any) int {
	w.t.Helper()
	var n int
	var err error
	for range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = w.admin.QueryRow(ctx, sql, args...).Scan(&n)
		cancel()
		if err == nil {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.t.Fatalf("count %q: %v", sql, err)
	return 0
}

// finalJobs counts jobs in a final state.
func (w *world) finalJobs() int {
	return w.count(`SELECT count(*) FROM ` + w.table("jobs") + ` WHERE state IN ('succeeded', 'failed', 'cancelled')`)
}

func (w *world) succeededJobs() int {
	return w.count(`SELECT count(*) FROM ` + w.table("jobs") + ` WHERE state = 'succeeded'`)
}

// effectHandler writes the job's effect in the claim transaction, holds the
// transaction for up to maxHold (work in progress, where kills land), then
// fails or succeeds as the job's mode says.
func effectHandler(schema string, maxHold time.Duration) queue.Handler {
	insert := `INSERT INTO ` + sqlident.Quote(schema, effectsTable) + ` (job_id, attempt, unique_key) VALUES ($1, $2, $3)`
	return queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
		var p struct{ Mode string }
		if err := json.Unmarshal(j.Payload, &p); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insert, j.ID, j.Attempt, j.UniqueKey); err != nil {
			return err
		}
		if maxHold > 0 {
			t := time.NewTimer(rand.N(maxHold))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		switch {
		case p.Mode == modeFailAlways:
			return errors.New("planned failure (fail_always)")
		case p.Mode == modeFailFirst && j.Attempt == 1:
			return errors.New("planned failure (fail_first)")
		}
		return nil
	})
}

// workerConfig is the queue.Config of a workload worker.
func workerConfig(schema string, poll, maxHold time.Duration) queue.Config {
	return queue.Config{
		Schema:          schema,
		Queues:          map[string]queue.QueueConfig{workQueue: {MaxWorkers: 4}},
		Handlers:        map[string]queue.Handler{jobKind: effectHandler(schema, maxHold)},
		PollInterval:    poll,
		JobTimeout:      time.Minute,
		ShutdownTimeout: 10 * time.Second,
		Backoff:         func(int) time.Duration { return 20 * time.Millisecond },
	}
}

// startWorker runs an in-process worker client on its own pool until the
// test ends; stop ends it early.
func (w *world) startWorker(url string, poll, maxHold time.Duration) (c *queue.Client, stop func()) {
	w.t.Helper()
	pool := w.poolOn(url, appWorker, 6)
	c, err := queue.New(pool, workerConfig(w.schema, poll, maxHold))
	require.NoError(w.t, err)
	return c, pgtest.RunInBackground(w.t, "worker", c.Run)
}

// producers enqueue jobs 0..n-1 at about rate jobs/s in total (0: as fast
// as they can), each retrying its own failed enqueues until they are known
// to be committed. An enqueue whose outcome is unknown (the connection died
// around the commit) may have committed: the unique key makes a retry of a
// pending job a no-op, and a retry first looks the keys up, because a job
// that already finished no longer holds its key.
type producers struct {
	w        *world
	n, count int
	rate     float64
	pool     *pgxpool.Pool
	client   *queue.Client

	errors  atomic.Int64 // failed enqueue calls
	retries atomic.Int64 // re-enqueues after a failure
	done    chan struct{}
	err     error
}

func (w *world) produce(url string, n, count int, rate float64) *producers {
	w.t.Helper()
	pool := w.poolOn(url, appProducer, int32(count+2))
	c, err := queue.New(pool, queue.Config{Schema: w.schema})
	require.NoError(w.t, err)
	p := &producers{w: w, n: n, count: count, rate: rate, pool: pool, client: c, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	w.t.Cleanup(func() { cancel(); <-p.done })
	go func() {
		defer close(p.done)
		var wg sync.WaitGroup
		var mu sync.Mutex
		for k := range count {
			wg.Go(func() {
				if err := p.run(ctx, k); err != nil {
					mu.Lock()
					p.err = errors.Join(p.err, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}()
	return p
}

// wait blocks until every job was enqueued (or d passed) and fails the test
// if a producer gave up.
func (p *producers) wait(d time.Duration) {
	p.w.t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		p.w.t.Fatalf("producers not done after %s", d)
	}
	require.NoError(p.w.t, p.err)
}

// run enqueues jobs k, k+count, ... in calls of 1 (Enqueue), 5 (EnqueueMany)
// and 3 (EnqueueManyTx in a transaction of ours) jobs.
func (p *producers) run(ctx context.Context, k int) error {
	start := time.Now()
	sent := 0
	sizes := []int{1, 5, 3}
	for call, i := 0, k; i < p.n; call++ {
		var idx []int
		for len(idx) < sizes[call%len(sizes)] && i < p.n {
			idx = append(idx, i)
			i += p.count
		}
		if err := p.enqueueReliably(ctx, call%len(sizes), idx); err != nil {
			return err
		}
		sent += len(idx)
		if p.rate > 0 {
			due := start.Add(time.Duration(float64(sent) / (p.rate / float64(p.count)) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
	}
	return nil
}

func (p *producers) enqueueReliably(ctx context.Context, how int, idx []int) error {
	backoff := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			p.retries.Add(1)
		}
		err := p.enqueue(ctx, how, idx)
		if err == nil {
			return nil
		}
		var je *queue.JobError
		if errors.As(err, &je) || ctx.Err() != nil {
			return fmt.Errorf("enqueue %v: %w", idx, err)
		}
		p.errors.Add(1)
		if attempt > 1000 {
			return fmt.Errorf("enqueue %v: giving up after %d attempts: %w", idx, attempt, err)
		}
		time.Sleep(backoff)
		backoff = min(backoff*2, time.Second)
		// The failed call may have committed: keep only the keys not there.
		left, err := p.missing(ctx, idx)
		for err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			time.Sleep(backoff)
			backoff = min(backoff*2, time.Second)
			left, err = p.missing(ctx, idx)
		}
		if len(left) == 0 {
			return nil
		}
		idx = left
	}
}

func (p *producers) enqueue(ctx context.Context, how int, idx []int) error {
	jobs := make([]queue.NewJob, len(idx))
	for n, i := range idx {
		jobs[n] = newJob(i)
	}
	switch {
	case how == 0 && len(jobs) == 1:
		_, err := p.client.Enqueue(ctx, jobs[0])
		return err
	case how == 2:
		return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			_, err := p.client.EnqueueManyTx(ctx, tx, jobs)
			return err
		})
	default:
		_, err := p.client.EnqueueMany(ctx, jobs)
		return err
	}
}

// missing returns the indexes whose unique key no job holds.
func (p *producers) missing(ctx context.Context, idx []int) ([]int, error) {
	keys := make([]string, len(idx))
	for n, i := range idx {
		keys[n] = fmt.Sprintf("%s%d", keyPrefix, i)
	}
	rows, err := p.pool.Query(ctx, `SELECT unique_key FROM `+p.w.table("jobs")+` WHERE unique_key = ANY($1)`, keys)
	if err != nil {
		return nil, err
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	got := map[string]bool{}
	for _, k := range have {
		got[k] = true
	}
	var out []int
	for n, i := range idx {
		if !got[keys[n]] {
			out = append(out, i)
		}
	}
	return out, nil
}

// waitAllFinal waits until n jobs are final (with a generous deadline) and
// returns when the last one finished.
func (w *world) waitAllFinal(n int, d time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := w.finalJobs()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			w.t.Errorf("only %d of %d jobs final after %s", got, n, d)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// report is what a fault test measured.
type report struct {
	Test           string
	Jobs           int           // distinct jobs expected
	Succeeded      int           // jobs succeeded
	Failed         int           // jobs failed for good (1 in 100 by design)
	DuplicateJobs  int           // unique keys held by more than one job
	DuplicateFX    int           // succeeded jobs with more than one effect
	Lost           int           // keys never enqueued, or succeeded without effect
	Unfinished     int           // jobs not final when checked (still pending)
	FailedFX       int           // effects left by failed attempts
	Mismatches     int           // jobs whose events disagree with the jobs row
	Retries        int           // attempts beyond the first, summed
	WorstStall     time.Duration // longest gap between two job completions
	Faults         int           // faults injected
	ProducerErrors int64         // enqueue calls that failed and were retried
	Extra          string
	Problems       []string
}

func (r report) String() string {
	s := fmt.Sprintf("RESULT %s: jobs=%d succeeded=%d failed=%d duplicate_effects=%d duplicate_jobs=%d lost=%d unfinished=%d failed_attempt_effects=%d event_mismatches=%d retried_attempts=%d faults=%d producer_errors=%d worst_stall=%s",
		r.Test, r.Jobs, r.Succeeded, r.Failed, r.DuplicateFX, r.DuplicateJobs, r.Lost, r.Unfinished, r.FailedFX, r.Mismatches, r.Retries,
		r.Faults, r.ProducerErrors, r.WorstStall.Round(time.Millisecond))
	if r.Extra != "" {
		s += " " + r.Extra
	}
	return s
}

// check verifies the invariants over jobs 0..n-1 in one REPEATABLE READ
// snapshot and fails the test on any violation. exactAttempts: no fault
// could fail an attempt other than by design (kills only roll back), so ok
// jobs took 1 attempt and fail_first jobs 2.
func (w *world) check(name string, n int, exactAttempts bool, faults int, prod *producers, extra string) report {
	w.t.Helper()
	ctx := context.Background()
	r := report{Test: name, Jobs: n, Faults: faults, Extra: extra}
	if prod != nil {
		r.ProducerErrors = prod.errors.Load()
	}
	problem := func(format string, args ...any) {
		if len(r.Problems) < 20 {
			r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
		}
	}
	var tx pgx.Tx
	var err error
	for range 100 { // the server may still be coming back
		tx, err = w.admin.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(w.t, err)
	defer func() { _ = tx.Rollback(ctx) }()

	type job struct {
		id                  int64
		key, kind           string
		state               queue.JobState
		attempts, maxAtt    int
		finished            *time.Time
		payload             []byte
		effects             []int // attempts of the effects
		events              []ev
		effectAfterFinished bool
	}
	jobs := map[int64]*job{}
	byKey := map[string][]*job{}
	rows, err := tx.Query(ctx, `SELECT id, coalesce(unique_key, ''), state, kind, attempts, max_attempts, finished_at, payload FROM `+w.table("jobs"))
	require.NoError(w.t, err)
	for rows.Next() {
		j := &job{}
		require.NoError(w.t, rows.Scan(&j.id, &j.key, &j.state, &j.kind, &j.attempts, &j.maxAtt, &j.finished, &j.payload))
		jobs[j.id] = j
		byKey[j.key] = append(byKey[j.key], j)
	}
	require.NoError(w.t, rows.Err())

	rows, err = tx.Query(ctx, `SELECT job_id, attempt, at FROM `+w.table(effectsTable))
	require.NoError(w.t, err)
	orphanFX := 0
	for rows.Next() {
		var id int64
		var attempt int
		var at time.Time
		require.NoError(w.t, rows.Scan(&id, &attempt, &at))
		j := jobs[id]
		if j == nil {
			orphanFX++
			continue
		}
		j.effects = append(j.effects, attempt)
		if j.finished != nil && at.After(*j.finished) {
			j.effectAfterFinished = true
		}
	}
	require.NoError(w.t, rows.Err())
	if orphanFX > 0 {
		problem("%d effects of jobs that do not exist", orphanFX)
		r.FailedFX += orphanFX
	}

	rows, err = tx.Query(ctx, `SELECT job_id, type, attempt FROM `+w.table("events")+` ORDER BY id`)
	require.NoError(w.t, err)
	orphanEv := 0
	for rows.Next() {
		var id int64
		var e ev
		require.NoError(w.t, rows.Scan(&id, &e.typ, &e.attempt))
		if j := jobs[id]; j != nil {
			j.events = append(j.events, e)
		} else {
			orphanEv++
		}
	}
	require.NoError(w.t, rows.Err())
	if orphanEv > 0 {
		problem("%d events of jobs that do not exist", orphanEv)
		r.Mismatches += orphanEv
	}

	for i := range n {
		key := fmt.Sprintf("%s%d", keyPrefix, i)
		js := byKey[key]
		if len(js) == 0 {
			r.Lost++
			problem("%s was never enqueued", key)
			continue
		}
		if len(js) > 1 {
			r.DuplicateJobs++
			problem("%s is held by %d jobs", key, len(js))
		}
		for _, j := range js {
			mode := modeOf(i)
			switch j.state {
			case queue.StateSucceeded:
				r.Succeeded++
				if len(j.effects) > 1 {
					r.DuplicateFX++
					problem("job %d (%s) has %d effects", j.id, key, len(j.effects))
				}
				if len(j.effects) == 0 {
					r.Lost++
					problem("job %d (%s) succeeded without its effect", j.id, key)
				}
				if len(j.effects) == 1 && j.effects[0] != j.attempts {
					r.FailedFX++
					problem("job %d (%s) succeeded on attempt %d but its effect is from attempt %d", j.id, key, j.attempts, j.effects[0])
				}
				if j.effectAfterFinished {
					problem("job %d (%s) has an effect written after it finished", j.id, key)
				}
				if mode == modeFailAlways {
					problem("job %d (%s) is fail_always but succeeded", j.id, key)
				}
				if exactAttempts {
					want := map[string]int{modeOK: 1, modeFailFirst: 2}[mode]
					if j.attempts != want {
						problem("job %d (%s, %s) took %d attempts, want %d", j.id, key, mode, j.attempts, want)
					}
				}
			case queue.StateFailed:
				r.Failed++
				if len(j.effects) > 0 {
					r.FailedFX += len(j.effects)
					problem("failed job %d (%s) left %d effects", j.id, key, len(j.effects))
				}
				if j.attempts != j.maxAtt {
					problem("failed job %d (%s) has %d of %d attempts", j.id, key, j.attempts, j.maxAtt)
				}
				if mode != modeFailAlways {
					problem("job %d (%s, %s) failed for good", j.id, key, mode)
				}
			default:
				r.Unfinished++
				problem("job %d (%s) is %s, not final", j.id, key, j.state)
			}
			if j.attempts > 0 {
				r.Retries += j.attempts - 1
			}
			if msg := eventsAgree(j.events, j.state, j.attempts); msg != "" {
				r.Mismatches++
				problem("job %d (%s): %s", j.id, key, msg)
			}
		}
	}
	for key, js := range byKey {
		var i int
		if _, err := fmt.Sscanf(key, keyPrefix+"%d", &i); err != nil || i < 0 || i >= n || fmt.Sprintf("%s%d", keyPrefix, i) != key {
			problem("%d jobs with key %q that the workload did not enqueue", len(js), key)
		}
	}

	// Worst stall: the longest gap between two consecutive completions.
	var ends []time.Time
	for _, j := range jobs {
		if j.finished != nil {
			ends = append(ends, *j.finished)
		}
	}
	sort.Slice(ends, func(a, b int) bool { return ends[a].Before(ends[b]) })
	for k := 1; k < len(ends); k++ {
		r.WorstStall = max(r.WorstStall, ends[k].Sub(ends[k-1]))
	}

	w.t.Log(r.String())
	for _, p := range r.Problems {
		w.t.Errorf("invariant violated: %s", p)
	}
	return r
}

type ev struct {
	typ     queue.EventType
	attempt int
}

// eventsAgree replays a job's events through the transition table and
// compares the outcome with its row: enqueued first, each later event a
// transition of the table and one attempt further (this workload neither
// snoozes nor leases), ending in the row's state and attempts. Returns ""
// when they agree.
func eventsAgree(evs []ev, state queue.JobState, attempts int) string {
	if len(evs) == 0 || evs[0].typ != queue.EventEnqueued || evs[0].attempt != 0 {
		return fmt.Sprintf("events do not start with enqueued: %v", evs)
	}
	cur, at := queue.StatePending, 0
	for _, e := range evs[1:] {
		next, ok := queue.Next(cur, e.typ)
		if !ok {
			return fmt.Sprintf("%s event after the job was %s: %v", e.typ, cur, evs)
		}
		if e.attempt != at+1 {
			return fmt.Sprintf("%s event for attempt %d after attempt %d: %v", e.typ, e.attempt, at, evs)
		}
		cur, at = next, e.attempt
	}
	if cur != state || at != attempts {
		return fmt.Sprintf("events say %s after %d attempts, the row %s after %d", cur, at, state, attempts)
	}
	return ""
}
