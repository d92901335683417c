package events_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	code := pgtest.Run(m)
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill/pubsub/gochannel.(*GoChannel).Subscribe.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// env is one test's schema (migrated), and the slot and publication named
// after it. Cleanup drops the slot and the publication.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	slot   string
	pub    string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	_, err := migrations.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	e := &env{t: t, pool: pool, schema: schema, slot: schema + "_slot", pub: schema + "_pub"}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := events.DropSlot(ctx, pool, e.slot, true); err != nil && !isNotFound(err) {
			t.Errorf("dropping slot %s: %v", e.slot, err)
		}
		if err := events.DropPublication(ctx, pool, e.pub); err != nil {
			t.Errorf("dropping publication: %v", err)
		}
	})
	return e
}

func isNotFound(err error) bool { return errors.Is(err, events.ErrSlotNotFound) }

func (e *env) table(name string) string { return sqlident.Quote(e.schema, name) }

func (e *env) config(pub message.Publisher) events.Config {
	return events.Config{Schema: e.schema, Slot: e.slot, Publication: e.pub, Publisher: pub,
		StatusInterval: 200 * time.Millisecond, LagInterval: 200 * time.Millisecond, MaxBackoff: time.Second}
}

// runStream runs a stream until the test ends (or stop is called) and waits
// until it streams.
func (e *env) runStream(cfg events.Config) (s *events.Stream, stop func()) {
	e.t.Helper()
	s, err := events.New(e.pool, cfg)
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(e.t, err)
			case <-time.After(60 * time.Second):
				e.t.Error("Stream.Run did not return within 60s of cancel")
			}
		})
	}
	e.t.Cleanup(stop)
	waitFor(e.t, 60*time.Second, "stream streaming", func() bool {
		select {
		case err := <-done:
			e.t.Fatalf("Stream.Run returned early: %v", err)
		default:
		}
		return s.Sessions() > 0
	})
	return s, stop
}

// queueClient returns a queue client on the env's schema whose "ok" jobs
// succeed and "bad" jobs always fail (MaxAttempts decides how often).
func (e *env) queueClient(workers int) *queue.Client {
	e.t.Helper()
	c, err := queue.New(e.pool, queue.Config{
		Schema:       e.schema,
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: workers}, "other": {MaxWorkers: 2}},
		PollInterval: 200 * time.Millisecond,
		Backoff:      func(int) time.Duration { return time.Millisecond },
		Handlers: map[string]queue.Handler{
			"ok":  queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil }),
			"bad": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return fmt.Errorf("always fails") }),
		},
	})
	require.NoError(e.t, err)
	return c
}

// runQueue runs c until the test ends.
func (e *env) runQueue(c *queue.Client) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(e.t, err)
			case <-time.After(60 * time.Second):
				e.t.Error("queue Run did not return within 60s")
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (e *env) pendingJobs() int {
	return e.count(`SELECT count(*) FROM ` + e.table("jobs") + ` WHERE state = 'pending'`)
}

// tableEvents returns every event of the table by id.
func (e *env) tableEvents() map[int64]events.Event {
	e.t.Helper()
	out := map[int64]events.Event{}
	err := events.Read(context.Background(), e.pool, e.schema, events.From{}, func(ev events.Event) error {
		out[ev.ID] = ev
		return nil
	})
	require.NoError(e.t, err)
	return out
}

// collector receives messages of a subscription, decodes and acks them.
type collector struct {
	mu   sync.Mutex
	msgs []received
	done chan struct{}
}

type received struct {
	ev  events.Event
	lsn uint64
}

func collect(t *testing.T, ch <-chan *message.Message) *collector {
	c := &collector{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for msg := range ch {
			ev, err := events.Decode(msg.Payload)
			if err != nil {
				t.Errorf("decode: %v", err)
			}
			id, err := events.MessageEventID(msg)
			if err != nil || id != ev.ID {
				t.Errorf("message event id %d (%v) != payload id %d", id, err, ev.ID)
			}
			lsn, err := events.MessageLSN(msg)
			if err != nil {
				t.Errorf("lsn: %v", err)
			}
			c.mu.Lock()
			c.msgs = append(c.msgs, received{ev, uint64(lsn)})
			c.mu.Unlock()
			msg.Ack()
		}
	}()
	return c
}

func (c *collector) snapshot() []received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]received(nil), c.msgs...)
}

// checkDelivery asserts: every table event arrived at least once, nothing
// arrived that the table lacks, LSNs never go back except at a redelivery
// (a restart), and per job the first deliveries are in id order.
func checkDelivery(t *testing.T, got []received, table map[int64]events.Event) {
	t.Helper()
	seen := map[int64]bool{}
	lastPerJob := map[int64]int64{}
	for _, r := range got {
		want, ok := table[r.ev.ID]
		require.True(t, ok, "event %d arrived but is not in the table (rolled back?)", r.ev.ID)
		require.Equal(t, want.JobID, r.ev.JobID)
		require.Equal(t, want.Type, r.ev.Type)
		require.True(t, want.At.Equal(r.ev.At), "event %d at %v, table %v", r.ev.ID, r.ev.At, want.At)
		if seen[r.ev.ID] {
			continue
		}
		seen[r.ev.ID] = true
		require.Greater(t, r.ev.ID, lastPerJob[r.ev.JobID], "job %d: event %d after %d", r.ev.JobID, r.ev.ID, lastPerJob[r.ev.JobID])
		lastPerJob[r.ev.JobID] = r.ev.ID
	}
	var missing []int64
	for id := range table {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	sort.Slice(missing, func(i, j int) bool { return missing[i] < missing[j] })
	require.Empty(t, missing, "events never delivered (of %d)", len(table))
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
