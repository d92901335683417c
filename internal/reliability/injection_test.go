package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
)

// hostile are names built to break out of an identifier, a string literal
// or a NOTIFY channel, or to be truncated by PostgreSQL.
var hostile = []string{
	`x"; DROP TABLE canary; --`,
	`x'; DROP TABLE canary; --`,
	`x); DROP TABLE canary; --`,
	`pgwake.jobs`,
	`a b`,
	"a\x00b",
	"a\nb",
	`ünïcödé`,
	"Ωmega",
	`UPPER`,
	`$1`,
	`a\`,
	`"quoted"`,
	strings.Repeat("a", 64),
	strings.Repeat("a", 200),
	"",
	"1abc",
	"\xff\xfe",
}

var canaryMu sync.Mutex

// canary is a table the hostile names try to drop; it must survive.
func canary(t *testing.T, w *world) func() {
	t.Helper()
	ctx := context.Background()
	// Parallel tests would race on IF NOT EXISTS (a unique violation on
	// pg_type), so one creates it at a time.
	canaryMu.Lock()
	_, err := w.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.canary (x int)`)
	canaryMu.Unlock()
	require.NoError(t, err)
	return func() {
		t.Helper()
		var ok bool
		require.NoError(t, w.admin.QueryRow(ctx, `SELECT to_regclass('public.canary') IS NOT NULL`).Scan(&ok))
		require.True(t, ok, "the canary table was dropped")
	}
}

// schemaNames returns the schemas other than the harness's own per-test
// ones (parallel tests create and drop those all the time).
func schemaNames(t *testing.T, w *world) map[string]bool {
	t.Helper()
	// Not the tests' own schemas (t_... and TestMigrateRefusesAForeignSchema's
	// foreign_... and owned_...; one appeared during a run with -parallel 4), nor the
	// temporary schemas a backend of a parallel test creates the first time
	// it uses a temporary table (pg_temp_N, pg_toast_temp_N): one appeared
	// during a run of make test.
	rows, err := w.admin.Query(context.Background(), `SELECT nspname::text FROM pg_namespace WHERE nspname NOT LIKE 't\_%'
		AND nspname NOT LIKE 'foreign\_%' AND nspname NOT LIKE 'owned\_%' AND nspname NOT LIKE 'pg\_temp\_%' AND nspname NOT LIKE 'pg\_toast\_temp\_%'`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	set := map[string]bool{}
	for _, n := range names {
		set[n] = true
	}
	return set
}

// newSchemas returns the names in after that are not in before: a schema
// another test dropped meanwhile (a parallel test's own, fixed name) is no
// concern here.
func newSchemas(before, after map[string]bool) []string {
	var added []string
	for n := range after {
		if !before[n] {
			added = append(added, n)
		}
	}
	return added
}

// TestHostileIdentifiers sends every hostile name through each place a name
// becomes SQL text or a channel: the schema (migrations, queue, events,
// pubsub), queue names (enqueue and config), NOTIFY channels, replication
// slots and publications. Each is refused with its typed error before
// anything reaches the server.
func TestHostileIdentifiers(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	alive := canary(t, w)
	ctx := context.Background()
	before := schemaNames(t, w)
	pub := message.Publisher(events.NewGoChannel(watermill.NopLogger{}))
	for _, name := range hostile {
		require.Error(t, notify.ValidateChannel(name), "channel %q", name)
		if name == "" {
			continue // the default schema, slot, publication
		}
		_, err := migrations.Up(ctx, w.admin, name)
		require.ErrorIs(t, err, migrations.ErrInvalidSchema, "migrations.Up(%q)", name)
		_, err = migrations.StatusOf(ctx, w.admin, name)
		require.ErrorIs(t, err, migrations.ErrInvalidSchema, "migrations.StatusOf(%q)", name)

		_, err = queue.New(w.admin, queue.Config{Schema: name})
		require.ErrorIs(t, err, queue.ErrInvalidSchema, "queue schema %q", name)
		if queue.ValidateQueue(name) != nil {
			_, err = queue.New(w.admin, queue.Config{Schema: w.schema, Queues: map[string]queue.QueueConfig{name: {}}})
			require.ErrorIs(t, err, queue.ErrInvalidConfig, "queue config %q", name)
		}

		_, err = events.New(w.admin, events.Config{Schema: name, Publisher: pub})
		require.Error(t, err, "events schema %q", name)
		_, err = events.New(w.admin, events.Config{Schema: w.schema, Slot: name, Publisher: pub})
		{
			require.ErrorIs(t, err, events.ErrInvalidSlotName, "slot %q", name)
			require.ErrorIs(t, events.DropSlot(ctx, w.admin, name, true), events.ErrInvalidSlotName, "DropSlot(%q)", name)
			_, err = events.New(w.admin, events.Config{Schema: w.schema, Publication: name, Publisher: pub})
			require.ErrorIs(t, err, events.ErrInvalidConfig, "publication %q", name)
			require.Error(t, events.DropPublication(ctx, w.admin, name), "DropPublication(%q)", name)
			require.Error(t, events.EnsurePublication(ctx, w.admin, w.schema, name), "EnsurePublication(%q)", name)
		}
		_, err = pubsub.NewPublisher(w.admin, pubsub.PublisherConfig{Schema: name})
		require.Error(t, err, "pubsub schema %q", name)
	}
	// Queue names in enqueue: a typed *JobError, nothing written.
	c, err := queue.New(w.admin, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	accepted := 0
	for _, name := range hostile {
		if name == "" {
			continue // the default queue
		}
		if queue.ValidateQueue(name) == nil {
			// A plain name ("pgwake.jobs", "1abc"): a value, stored verbatim.
			r, err := c.Enqueue(ctx, queue.NewJob{Queue: name, Kind: "k"})
			require.NoError(t, err)
			require.Equal(t, 1, w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE id = $1 AND queue = $2`, r.ID, name))
			accepted++
			continue
		}
		_, err := c.Enqueue(ctx, queue.NewJob{Queue: name, Kind: "k"})
		var je *queue.JobError
		require.ErrorAs(t, err, &je, "queue %q", name)
		require.ErrorIs(t, err, queue.ErrInvalidQueue)
		require.Equal(t, "queue", je.Field)
	}
	require.Equal(t, accepted, w.count(`SELECT count(*) FROM `+w.table("jobs")))
	require.Empty(t, newSchemas(before, schemaNames(t, w)), "a schema was created")
	alive()
}

// TestHostileValues: kinds, unique keys, payload text and error text are
// values, sent as parameters: quotes, semicolons and unicode are stored
// verbatim and a handler registered under such a kind runs; NUL bytes and
// over-long kinds are refused with a typed error.
func TestHostileValues(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	alive := canary(t, w)
	ctx := context.Background()
	kinds := []string{`x';DROP/**/TABLE/**/canary;--`, `x";DROP/**/TABLE/**/canary;--`, `ünï|cödé`, "日本語", `$1::text`, `\`, strings.Repeat("k", queue.MaxKindLen)}
	ran := make(chan string, len(kinds))
	handlers := map[string]queue.Handler{}
	for _, k := range kinds {
		handlers[k] = queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran <- j.Kind + "\x00" + j.UniqueKey + "\x00" + string(j.Payload)
			return nil
		})
	}
	pool := w.pool(appWorker, 8)
	c, err := queue.New(pool, queue.Config{Schema: w.schema, Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Handlers: handlers, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	want := map[string]bool{}
	for _, k := range kinds {
		payload := json.RawMessage(`{"s":` + mustMarshal(t, k) + `}`)
		_, err := c.Enqueue(ctx, queue.NewJob{Kind: k, UniqueKey: k, Payload: payload})
		require.NoError(t, err, "kind %q", k)
		var got []byte
		require.NoError(t, w.admin.QueryRow(ctx, `SELECT payload::text FROM `+w.table("jobs")+` WHERE kind = $1`, k).Scan(&got))
		want[k+"\x00"+k] = true
	}
	deadline := time.After(time.Minute)
	for range kinds {
		select {
		case s := <-ran:
			parts := strings.SplitN(s, "\x00", 3)
			require.True(t, want[parts[0]+"\x00"+parts[1]], "unexpected job %q", parts[0])
			var p struct{ S string }
			require.NoError(t, json.Unmarshal([]byte(parts[2]), &p))
			require.Equal(t, parts[0], p.S, "payload round trip")
		case <-deadline:
			t.Fatal("hostile-kind jobs did not run")
		}
	}
	// Refused: NUL, control characters, spaces, too long, invalid UTF-8.
	for _, k := range []string{"a\x00b", "a\nb", "a b", strings.Repeat("k", queue.MaxKindLen+1), "\xff"} {
		_, err := c.Enqueue(ctx, queue.NewJob{Kind: k})
		require.ErrorIs(t, err, queue.ErrInvalidKind, "kind %q", k)
	}
	for _, key := range []string{"a\x00b", "\xff", strings.Repeat("u", 1025)} {
		_, err := c.Enqueue(ctx, queue.NewJob{Kind: kinds[0], UniqueKey: key})
		require.ErrorIs(t, err, queue.ErrInvalidUniqueKey, "unique key %q", key)
	}
	require.Equal(t, len(kinds), w.count(`SELECT count(*) FROM `+w.table("jobs")))
	alive()
}

// TestHostileTopics publishes to and subscribes on topics and consumer
// groups full of SQL and channel metacharacters through the Watermill
// Pub/Sub: they map to valid queue names and messages arrive intact.
func TestHostileTopics(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	alive := canary(t, w)
	pool := w.pool(appWorker, 16)
	topics := []string{`t'; DROP TABLE canary; --`, `t"; NOTIFY x; --`, `Ünï Cödé topic`, strings.Repeat("ü", 100)}
	for _, topic := range topics {
		q, err := pubsub.QueueName(topic, `g'; --`)
		require.NoError(t, err)
		require.NoError(t, queue.ValidateQueue(q), "topic %q maps to %q", topic, q)
		sub, err := pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{Schema: w.schema, ConsumerGroup: `g'; --`})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err, "subscribe %q", topic)
		pub, err := pubsub.NewPublisher(pool, pubsub.PublisherConfig{Schema: w.schema})
		require.NoError(t, err)
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(topic))), "publish %q", topic)
		select {
		case m := <-msgs:
			require.Equal(t, topic, string(m.Payload))
			m.Ack()
		case <-time.After(time.Minute):
			t.Fatalf("message on %q did not arrive", topic)
		}
		cancel()
		require.NoError(t, sub.Close())
		require.NoError(t, pub.Close())
	}
	for _, bad := range []string{"", "a\x00b", "\xff", strings.Repeat("t", pubsub.MaxTopicLen+1)} {
		require.ErrorIs(t, pubsub.ValidateTopic(bad), pubsub.ErrInvalidTopic, "topic %q", bad)
	}
	alive()
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

var _ = errors.Is
var _ = sqlident.Quote
var _ = pgtest.URL
