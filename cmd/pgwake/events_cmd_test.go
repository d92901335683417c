package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/natstest"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// eventsSchema migrates a fresh schema and, when the test ends, drops the
// default slot and publication that the events commands create for it.
func eventsSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	_, err := migrations.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = events.DropSlot(context.Background(), pool, schema+"_events", true)
		_ = events.DropPublication(context.Background(), pool, schema+"_events")
	})
	return pool, schema
}

func TestEventsCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := eventsSchema(t)

	// tail on a temporary slot prints the events committed after it started.
	p := startPgwake(t, "events", "tail", "--schema", schema)
	p.waitStderr(regexp.MustCompile(`streaming events`))
	c, err := queue.New(pool, queue.Config{Schema: schema})
	require.NoError(t, err)
	_, err = c.EnqueueMany(ctx, []queue.NewJob{{Kind: "a"}, {Kind: "b", Queue: "q2"}, {Kind: "c"}})
	require.NoError(t, err)
	var lines []string
	deadline := time.Now().Add(60 * time.Second)
	for len(lines) < 3 && time.Now().Before(deadline) {
		lines = strings.Fields(p.stdout.String())
		time.Sleep(20 * time.Millisecond)
	}
	require.Len(t, lines, 3, "stderr: %s", p.stderr.String())
	for i, l := range lines {
		ev, err := events.Decode([]byte(l))
		require.NoError(t, err)
		require.Equal(t, events.TypeEnqueued, ev.Type)
		require.Equal(t, string(rune('a'+i)), ev.Kind)
	}
	p.signal(syscall.SIGINT)
	require.Equal(t, 0, p.wait())
	// The temporary slot goes away with the tail's walsender.
	left := func() (names []string) {
		slots, err := events.Slots(ctx, pool)
		require.NoError(t, err)
		for _, s := range slots {
			if strings.HasPrefix(s.Name, schema) {
				names = append(names, s.Name)
			}
		}
		return names
	}
	for deadline := time.Now().Add(30 * time.Second); len(left()) > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	require.Empty(t, left(), "temporary slot left behind")

	// replay reads the table.
	out := mustRun(t, "", "events", "replay", "--schema", schema)
	require.Equal(t, lines, strings.Fields(out))
	first, err := events.Decode([]byte(lines[0]))
	require.NoError(t, err)
	out = mustRun(t, "", "events", "replay", "--schema", schema, "--after-id", itoa(first.ID), "--since", "1h")
	require.Equal(t, lines[1:], strings.Fields(out))

	require.Contains(t, mustRun(t, "", "events", "verify", "--schema", schema), "ok:")
	require.Contains(t, mustRun(t, "", "events", "prune", "--schema", schema, "--older-than", "1h"), "deleted 0 events")

	// slots and drop-slot.
	slot := schema + "_x"
	_, err = pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	require.NoError(t, err)
	require.Contains(t, mustRun(t, "", "events", "slots"), slot)
	require.Contains(t, mustRun(t, "", "events", "drop-slot", "--slot", slot), "dropped slot "+slot)
	r := pgwake(t, "", "events", "drop-slot", "--slot", slot)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not found")
}

func TestEventsCommandErrors(t *testing.T) {
	t.Parallel()
	r := pgwake(t, "", "events", "drop-slot", "--slot", "Bad-Name")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "invalid replication slot name")
	r = pgwake(t, "", "events", "forward", "--to", "kafka://x")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "nats:// or amqp://")
	r = pgwake(t, "", "events", "forward", "--to", "nats://127.0.0.1:1")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "NATS server unreachable")
	r = pgwake(t, "", "events", "forward", "--to", "amqp://guest:pw@127.0.0.1:1/")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "AMQP broker unreachable")
	require.NotContains(t, r.stderr, "pw@")
	// The broker URL from the environment (no password in ps), redacted in
	// errors: a NATS token, user and password.
	for _, u := range []string{"nats://t0kenSECRET@127.0.0.1:1", "nats://app:s3cretPW@127.0.0.1:1", "kafka://app:s3cretPW@x"} {
		r = pgwakeEnv(t, []string{envDatabaseURL + "=" + pgtest.URL(), envBrokerURL + "=" + u}, "", "events", "forward")
		require.NotEqual(t, 0, r.code, u)
		require.Contains(t, r.stderr, "xxxxx@", u)
		require.NotContains(t, r.stderr, "t0kenSECRET", u)
		require.NotContains(t, r.stderr, "s3cretPW", u)
	}
	r = pgwakeEnv(t, []string{envDatabaseURL + "=" + pgtest.URL()}, "", "events", "forward")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, envBrokerURL)
	r = pgwake(t, "", "events", "replay", "--since", "yesterday")
	require.Equal(t, 2, r.code)
	r = pgwake(t, "", "events", "nope")
	require.Equal(t, 2, r.code)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestEventsForwardToNATS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := eventsSchema(t)
	natsURL := natstest.URL()
	natstest.KeepJetStream(t)
	topic := "pgwake_cli_" + schema
	stream := strings.ToUpper(topic)
	nc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	js, err := nc.JetStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = js.DeleteStream(stream)
		nc.Close()
	})

	p := startPgwake(t, "events", "forward", "--schema", schema, "--to", natsURL, "--topic", topic,
		"--topic-by", "queue", "--nats-stream", stream, "--metrics-addr", "off")
	p.waitStderr(regexp.MustCompile(`streaming events`))
	c, err := queue.New(pool, queue.Config{Schema: schema})
	require.NoError(t, err)
	_, err = c.EnqueueMany(ctx, []queue.NewJob{{Kind: "a"}, {Kind: "b", Queue: "q2"}})
	require.NoError(t, err)

	sub, err := js.SubscribeSync(topic+".>", nats.OrderedConsumer(), nats.DeliverAll())
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	for _, want := range []struct{ subject, kind string }{{topic + ".default", "a"}, {topic + ".q2", "b"}} {
		msg, err := sub.NextMsg(30 * time.Second)
		require.NoError(t, err, "stderr: %s", p.stderr.String())
		require.Equal(t, want.subject, msg.Subject)
		ev, err := events.Decode(msg.Data)
		require.NoError(t, err)
		require.Equal(t, want.kind, ev.Kind)
	}
	p.signal(syscall.SIGINT)
	require.Equal(t, 0, p.wait())
	require.Contains(t, p.stderr.String(), "forwarder stopped")
}

// tail prints every event once across reconnects: its walsender is
// terminated twice while a producer commits events.
func TestEventsTailHasNoGapAcrossReconnects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := eventsSchema(t)
	p := startPgwake(t, "events", "tail", "--schema", schema)
	p.waitStderr(regexp.MustCompile(`streaming events`))
	c, err := queue.New(pool, queue.Config{Schema: schema})
	require.NoError(t, err)
	pctx, stopProducer := context.WithCancel(ctx)
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for pctx.Err() == nil {
			_, _ = c.EnqueueMany(ctx, []queue.NewJob{{Kind: "a"}, {Kind: "b"}, {Kind: "c"}})
			time.Sleep(5 * time.Millisecond)
		}
	}()
	printed := func() []string { return strings.Fields(p.stdout.String()) }
	for round := 1; round <= 2; round++ {
		before := len(printed())
		waitFor(t, "events printed", func() bool { return len(printed()) > before+30 })
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots
			WHERE slot_name LIKE $1 AND active_pid IS NOT NULL`, schema+`\_tail\_%`).Scan(&n))
		require.Equal(t, int64(1), n)
		waitFor(t, "reconnected", func() bool { return strings.Count(p.stderr.String(), "streaming events") > round })
	}
	stopProducer()
	<-produced
	var total int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.events`).Scan(&total))
	waitFor(t, "every event printed", func() bool { return len(printed()) >= total })
	seen := map[int64]int{}
	for _, l := range printed() {
		ev, err := events.Decode([]byte(l))
		require.NoError(t, err)
		seen[ev.ID]++
	}
	for id, n := range seen {
		require.Equal(t, 1, n, "event %d printed %d times", id, n)
	}
	require.Len(t, seen, total, "every event of the table printed")
	t.Logf("%d events printed once each across 2 reconnects", total)
	p.signal(syscall.SIGINT)
	require.Equal(t, 0, p.wait())
	slots, err := events.Slots(ctx, pool)
	require.NoError(t, err)
	for _, s := range slots {
		require.False(t, strings.HasPrefix(s.Name, schema), "slot %s left behind", s.Name)
	}
}

// A slot whose history predates the publication cannot be streamed: tail
// exits 1 within 5 s with one line that says why and what to do.
func TestEventsTailStopsOnAPermanentError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := eventsSchema(t)
	slot := schema + "_kept"
	_, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	require.NoError(t, err)
	t.Cleanup(func() { _ = events.DropSlot(context.Background(), pool, slot, true) })
	c, err := queue.New(pool, queue.Config{Schema: schema})
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "a"}) // before any publication exists
	require.NoError(t, err)
	pgwakeBin(t) // built before the clock starts
	start := time.Now()
	r := pgwake(t, "", "events", "tail", "--schema", schema, "--slot", slot)
	took := time.Since(start)
	require.Equal(t, 1, r.code, "stderr: %s", r.stderr)
	require.Less(t, took, 5*time.Second)
	var last string
	for _, l := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		if strings.HasPrefix(l, "pgwake events: ") {
			last = l
		}
	}
	require.Contains(t, last, "does not exist", r.stderr)
	require.Contains(t, last, "drop-slot", r.stderr)
}
