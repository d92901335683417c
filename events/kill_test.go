package events_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/queue"
)

// The helper process: the test binary re-executed with helperEnv set runs a
// forwarder (a Stream into tableSink) until it is killed or gets SIGTERM.
const helperEnv = "PGWAKE_TEST_EVENTS_HELPER"

// tableSink is a Watermill publisher that records each message (event id,
// job id, LSN) in <schema>.received, one INSERT per Publish call: a sink
// outside the forwarder process that the test can read.
type tableSink struct {
	pool   *pgxpool.Pool
	schema string
}

func (s tableSink) Publish(topic string, msgs ...*message.Message) error {
	ids, jobs, lsns := make([]int64, len(msgs)), make([]int64, len(msgs)), make([]string, len(msgs))
	for i, m := range msgs {
		ev, err := events.Decode(m.Payload)
		if err != nil {
			return err
		}
		ids[i], jobs[i], lsns[i] = ev.ID, ev.JobID, m.Metadata.Get(events.MetaLSN)
	}
	_, err := s.pool.Exec(context.Background(), `INSERT INTO `+sqlident.Quote(s.schema, "received")+` (event_id, job_id, lsn)
		SELECT e, j, l FROM unnest($1::bigint[], $2::bigint[], $3::text[]) WITH ORDINALITY AS t(e, j, l, o) ORDER BY o`, ids, jobs, lsns)
	return err
}

func (tableSink) Close() error { return nil }

func helperMain() int {
	url, schema, slot := os.Getenv("PGWAKE_TEST_URL"), os.Getenv("PGWAKE_TEST_SCHEMA"), os.Getenv("PGWAKE_TEST_SLOT")
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	// Exit when the test binary is gone (killed by a timeout, say).
	parent := os.Getppid()
	go func() {
		for range time.Tick(200 * time.Millisecond) {
			if os.Getppid() != parent {
				os.Exit(3)
			}
		}
	}()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer pool.Close()
	logCfg := zap.NewDevelopmentConfig()
	logCfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	logger, err := logCfg.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	var pub message.Publisher = tableSink{pool, schema}
	if relay := os.Getenv("PGWAKE_TEST_RELAY"); relay != "" {
		delay, _ := time.ParseDuration(os.Getenv("PGWAKE_TEST_PUBLISH_DELAY"))
		pub = relaySink{pool: pool, schema: schema, relay: relay, delay: delay}
	}
	cfg := events.Config{Schema: schema, Slot: slot, Publication: slot + "_pub",
		Logger:    logger,
		Publisher: pub, StatusInterval: 200 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}
	if v := os.Getenv("PGWAKE_TEST_WAL_SENDER_TIMEOUT"); v != "" {
		rc := pool.Config().ConnConfig.Config.Copy()
		rc.RuntimeParams["wal_sender_timeout"] = v
		cfg.ReplConnConfig = rc
	}
	s, err := events.New(pool, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	for s.Sessions() == 0 {
		select {
		case err := <-done:
			fmt.Fprintln(os.Stderr, "helper stream:", err)
			return 3
		case <-time.After(10 * time.Millisecond):
		}
	}
	fmt.Println("ready")
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "helper stream:", err)
		return 3
	}
	return 0
}

// forwarder is a running helper process.
type forwarder struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func startForwarder(t *testing.T, e *env, env ...string) *forwarder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "PGWAKE_TEST_URL="+e.Pool.Config().ConnString(),
		"PGWAKE_TEST_SCHEMA="+e.Schema, "PGWAKE_TEST_SLOT="+e.Slot)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	// Never leave a forwarder behind, whatever happens to the test.
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	buf := make([]byte, 6)
	_, err = out.Read(buf)
	require.NoError(t, err, "forwarder did not start")
	require.Equal(t, "ready\n", string(buf))
	return &forwarder{cmd: cmd, exited: exited}
}

// stop signals the forwarder and waits for it to exit.
func (f *forwarder) stop(t *testing.T, sig syscall.Signal) {
	require.NoError(t, f.cmd.Process.Signal(sig))
	select {
	case <-f.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the forwarder did not exit within 60s")
	}
}

// killJobs is the number of jobs of the kill test: $PGWAKE_EVENTS_KILL_JOBS,
// default 3,000 (1,000 with -short) to keep the package's tests well under
// the CI budget; the 20,000 is PGWAKE_EVENTS_KILL_JOBS=20000.
func killJobs(t *testing.T) int {
	if v := os.Getenv("PGWAKE_EVENTS_KILL_JOBS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	if testing.Short() {
		return 1000
	}
	return 3000
}

func TestForwarderKilledRepeatedlyLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// The publication has the name the helper derives from the slot.
	e.Pub = e.Slot + "_pub"
	_, err := e.Pool.Exec(ctx, `CREATE TABLE `+e.Table("received")+` (seq bigserial PRIMARY KEY, event_id bigint NOT NULL, job_id bigint NOT NULL, lsn text NOT NULL)`)
	require.NoError(t, err)
	n := killJobs(t)

	// The first forwarder creates the slot; the jobs start after it.
	fw := startForwarder(t, e)
	c := e.QueueClient(8)
	stopQueue := e.RunQueue(c)
	enqueued := make(chan error, 1)
	go func() {
		for i := 0; i < n; i += 100 {
			jobs := make([]queue.NewJob, min(100, n-i))
			for j := range jobs {
				jobs[j] = queue.NewJob{Kind: "ok"}
			}
			if _, err := c.EnqueueMany(ctx, jobs); err != nil {
				enqueued <- err
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		enqueued <- nil
	}()

	received := func() int { return e.Count(`SELECT count(*) FROM ` + e.Table("received")) }
	kills := 0
	for round := 0; round < 6; round++ {
		// Kill it while it forwards: after some more events went through.
		before := received()
		waitFor(t, 60*time.Second, "events forwarded", func() bool { return received() > before+20*(1+rand.IntN(10)) })
		fw.stop(t, syscall.SIGKILL)
		kills++
		fw = startForwarder(t, e)
	}
	require.NoError(t, <-enqueued)
	waitFor(t, 120*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 0 })
	stopQueue()

	// The last forwarder catches up; then everything is in the sink.
	var total int
	waitFor(t, 120*time.Second, "every event forwarded", func() bool {
		total = e.Count(`SELECT count(*) FROM ` + e.Table("events"))
		return e.Count(`SELECT count(DISTINCT event_id) FROM `+e.Table("received")+` r WHERE EXISTS (SELECT 1 FROM `+e.Table("events")+` v WHERE v.id = r.event_id)`) == total
	})
	fw.stop(t, syscall.SIGTERM)
	require.True(t, fw.cmd.ProcessState.Success(), "the forwarder stops cleanly on SIGTERM: %v", fw.cmd.ProcessState)

	// Deduplicated by event id, the sink equals the events table.
	require.Equal(t, 0, e.Count(`SELECT count(*) FROM (SELECT event_id FROM `+e.Table("received")+` EXCEPT SELECT id FROM `+e.Table("events")+`) x`), "events that are not in the table")
	require.Equal(t, 0, e.Count(`SELECT count(*) FROM (SELECT id FROM `+e.Table("events")+` EXCEPT SELECT event_id FROM `+e.Table("received")+`) x`), "events never forwarded")
	require.Equal(t, 2*n, total)
	// Per job, first deliveries are in event id (= commit) order.
	require.Equal(t, 0, e.Count(`
WITH firsts AS (SELECT event_id, job_id, min(seq) AS seq FROM `+e.Table("received")+` GROUP BY 1, 2)
SELECT count(*) FROM (SELECT event_id, lag(event_id) OVER (PARTITION BY job_id ORDER BY seq) AS prev FROM firsts) x WHERE prev > event_id`))
	deliveries := received()
	t.Logf("%d jobs, %d events, %d deliveries (%d duplicates) across %d SIGKILLs", n, total, deliveries, deliveries-total, kills)
	mismatches, err := events.Verify(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
	require.Empty(t, mismatches)
}
