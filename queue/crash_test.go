package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgwake/pgwake/queue"
)

// The helper process: the test binary re-executed with helperEnv set runs a
// worker until it is killed.
const helperEnv = "PGWAKE_TEST_HELPER_WORKER"

func helperMain() int {
	url, schema := os.Getenv("PGWAKE_TEST_URL"), os.Getenv("PGWAKE_TEST_SCHEMA")
	hold, _ := time.ParseDuration(os.Getenv("PGWAKE_TEST_HOLD"))
	var leased []string
	if k := os.Getenv("PGWAKE_TEST_LEASED"); k != "" {
		leased = []string{k}
	}
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	c, err := queue.New(pool, queue.Config{
		Schema:       schema,
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		PollInterval: 100 * time.Millisecond,
		Backoff:      func(int) time.Duration { return 20 * time.Millisecond },
		Handlers:     map[string]queue.Handler{"effect": effectHandler(schema, hold)},
		LeasedKinds:  leased,
		// Short, so a test waits little for a killed helper's leases.
		LeaseDuration: 300 * time.Millisecond,
		Periodic:      helperPeriodic(),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	fmt.Println("ready")
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	return 0
}

// helperPeriodic is the helper's schedule: tickSchedule with
// PGWAKE_TEST_PERIODIC set, none otherwise.
func helperPeriodic() []queue.PeriodicJob {
	if os.Getenv("PGWAKE_TEST_PERIODIC") == "" {
		return nil
	}
	return tickSchedule(false)
}

// effectHandler writes the job's effect in the claim transaction, then holds
// the transaction open for hold (a handler doing work). A job with payload
// {"die": "exit"} or {"die": "kill"} then kills its own process, with
// os.Exit or SIGKILL (a crash, an OOM kill); {"die": "kill-first"} does it
// before the effect, as its first step.
func effectHandler(schema string, hold time.Duration) queue.Handler {
	return queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
		var p struct {
			Die       string
			Hang      bool
			FailFirst bool // fail the first attempt after its effect and hold
		}
		_ = json.Unmarshal(j.Payload, &p)
		if p.Die == "kill-first" {
			// At once: the attempt record may still be in the socket's
			// buffer (corked), not yet sent.
			killSelf()
		}
		if err := effect(ctx, tx, schema, j); err != nil {
			return err
		}
		if p.Hang && j.Attempt == 1 {
			<-ctx.Done() // until its process is killed
			return ctx.Err()
		}
		switch p.Die {
		case "exit":
			os.Exit(7)
		case "kill":
			killSelf()
		}
		if hold > 0 {
			select {
			case <-time.After(hold):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if p.FailFirst && j.Attempt == 1 {
			return errors.New("late failure of the first attempt")
		}
		return nil
	})
}

func startHelper(t *testing.T, e *env, hold time.Duration) *exec.Cmd {
	t.Helper()
	return startHelperWith(t, e, hold)
}

// startHelperWith starts a helper worker with extra environment variables
// (PGWAKE_TEST_LEASED=kind runs that kind leased).
func startHelperWith(t *testing.T, e *env, hold time.Duration, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "PGWAKE_TEST_URL="+e.pool.Config().ConnString(),
		"PGWAKE_TEST_SCHEMA="+e.schema, "PGWAKE_TEST_HOLD="+hold.String())
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	buf := make([]byte, 6)
	_, err = out.Read(buf)
	require.NoError(t, err, "helper did not start")
	require.Equal(t, "ready\n", string(buf))
	return cmd
}

func TestWorkerProcessKilledMidHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	jobs := make([]queue.NewJob, 200)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "effect", Payload: map[string]int{"i": i}}
	}
	res, err := e.c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}

	// Kill helpers while their handlers hold written-but-uncommitted effects.
	for round := 0; round < 3; round++ {
		cmd := startHelper(t, e, 300*time.Millisecond)
		// Wait until its handlers are mid-transaction: idle-in-transaction
		// backends with our effects written.
		waitFor(t, 30*time.Second, "handlers in flight", func() bool {
			return e.countSQL(`SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND query LIKE '%' || $1 || '%effects%'`, e.schema) > 0
		})
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
	}
	before := e.count(`state = 'succeeded'`)
	require.Less(t, before, len(ids), "the kills must have interrupted work")

	// A fresh worker finishes the rest.
	cmd := startHelper(t, e, 0)
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	waitFor(t, 60*time.Second, "all jobs done", func() bool { return e.count(`state = 'succeeded'`) == len(ids) })
	e.requireExactlyOnce(ids)
	// A killed process's attempts run again, uncounted: one kill does not
	// show which job (if any) was at fault. Only an attempt lost while it
	// ran alone in its process counts: three kills can line up that way
	// for one job at most.
	require.Equal(t, 0, e.count(`attempts NOT IN (1, 2)`))
	require.LessOrEqual(t, e.count(`attempts = 2`), 1)
	checkEventsMatchJobs(t, e.pool, e.schema)
}

func TestEightWorkersFiveThousandJobsExactlyOnce(t *testing.T) {
	t.Parallel()
	const n = 5000
	base := newEnv(t, queue.Config{})
	ctx := context.Background()
	jobs := make([]queue.NewJob, n)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "effect", Priority: i % 3}
	}
	var ids []int64
	for i := 0; i < n; i += 1000 {
		res, err := base.c.EnqueueMany(ctx, jobs[i:i+1000])
		require.NoError(t, err)
		for _, r := range res {
			ids = append(ids, r.ID)
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		e := newEnvOn(t, base.pool, base.schema, queue.Config{
			Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 3}},
			PollInterval: 200 * time.Millisecond,
			Handlers:     map[string]queue.Handler{"effect": effectHandler(base.schema, 0)},
		})
		wg.Go(func() { e.run() })
	}
	wg.Wait()
	waitFor(t, 120*time.Second, "all jobs done", func() bool { return base.count(`state = 'succeeded'`) == n })
	base.requireExactlyOnce(ids)
	checkEventsMatchJobs(t, base.pool, base.schema)
}

func TestGracefulShutdownLetsHandlersFinish(t *testing.T) {
	started := make(chan int64, 10)
	release := make(chan struct{})
	var schema string
	e := newEnv(t, queue.Config{
		Queues:          map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		ShutdownTimeout: time.Minute,
		Handlers: map[string]queue.Handler{"hold": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			started <- j.ID
			<-release
			return nil
		})},
	})
	schema = e.schema
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead"))
	signals := queue.EnableTestSignals(e.c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.c.Run(ctx) }()
	r, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "hold"})
	require.NoError(t, err)
	<-started
	cancel()
	// A job enqueued after shutdown began is not claimed.
	later, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "hold"})
	require.NoError(t, err)
	// The dispatchers have stopped; Run waits for the running handler.
	signals.WaitDraining(t)
	select {
	case <-done:
		t.Fatal("Run returned while a handler was running")
	default:
	}
	close(release)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the handler finished")
	}
	require.Equal(t, 1, e.count(`id = $1 AND state = 'succeeded'`, r.ID))
	require.Equal(t, 1, e.count(`id = $1 AND state = 'pending' AND attempts = 0`, later.ID))
	select {
	case id := <-started:
		t.Fatalf("job %d started after shutdown", id)
	default:
	}
}

func TestShutdownDeadlineCancelsHandlersAndCountsTheAttempt(t *testing.T) {
	var schema string
	started := make(chan struct{}, 10)
	e := newEnv(t, queue.Config{
		Queues:          map[string]queue.QueueConfig{"default": {MaxWorkers: 3}},
		ShutdownTimeout: 200 * time.Millisecond,
		JobTimeout:      -1,
		Handlers: map[string]queue.Handler{"stuck": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		})},
	})
	schema = e.schema
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead"))
	for range 3 {
		_, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "stuck"})
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.c.Run(ctx) }()
	for range 3 {
		<-started
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the shutdown deadline")
	}
	// The handlers' writes rolled back; each attempt counts, as a failure
	// whose retry is scheduled.
	require.Equal(t, 3, e.count(`state = 'pending' AND attempts = 1 AND last_error LIKE '%context canceled%'`))
	require.Empty(t, e.effectCounts())
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// killSelf SIGKILLs the test's helper process and does not return.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
