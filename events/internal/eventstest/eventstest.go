// Package eventstest holds the test helpers of package events and its
// bridges: a migrated schema per test with its slot and publication dropped
// at cleanup, a running stream and queue, and a collector of delivered
// messages with the delivery checks.
package eventstest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// env is one test's schema (migrated), and the slot and publication named
// after it. Cleanup drops the slot and the publication.
type Env struct {
	T      testing.TB
	Pool   *pgxpool.Pool
	Schema string
	Slot   string
	Pub    string
}

func NewEnv(t testing.TB) *Env {
	t.Helper()
	return NewEnvOn(t, pgtest.Pool(t))
}

// NewEnvOn is NewEnv on another server's pool (a private cluster).
func NewEnvOn(t testing.TB, pool *pgxpool.Pool) *Env {
	t.Helper()
	schema := pgtest.Schema(t)
	_, err := migrations.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	e := &Env{T: t, Pool: pool, Schema: schema, Slot: schema + "_slot", Pub: schema + "_pub"}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := events.DropSlot(ctx, pool, e.Slot, true); err != nil && !isNotFound(err) {
			t.Errorf("dropping slot %s: %v", e.Slot, err)
		}
		if err := events.DropPublication(ctx, pool, e.Pub); err != nil {
			t.Errorf("dropping publication: %v", err)
		}
	})
	return e
}

func isNotFound(err error) bool { return errors.Is(err, events.ErrSlotNotFound) }

func (e *Env) Table(name string) string { return sqlident.Quote(e.Schema, name) }

func (e *Env) Config(pub message.Publisher) events.Config {
	// The stream's log goes to the test's, shown when the test fails.
	return events.Config{Schema: e.Schema, Slot: e.Slot, Publication: e.Pub, Publisher: pub,
		StatusInterval: 200 * time.Millisecond, LagInterval: 200 * time.Millisecond, MaxBackoff: time.Second,
		Logger: zaptest.NewLogger(e.T, zaptest.Level(zap.InfoLevel))}
}

// runStream runs a stream until the test ends (or stop is called) and waits
// until it streams.
func (e *Env) RunStream(cfg events.Config) (s *events.Stream, stop func()) {
	e.T.Helper()
	s, err := events.New(e.Pool, cfg)
	require.NoError(e.T, err)
	early := make(chan error, 1) // Run returned before stop
	stop = pgtest.RunInBackground(e.T, "stream", func(ctx context.Context) error {
		err := s.Run(ctx)
		if ctx.Err() == nil {
			early <- err
		}
		return err
	})
	WaitFor(e.T, 60*time.Second, "stream streaming", func() bool {
		select {
		case err := <-early:
			e.T.Fatalf("Stream.Run returned early: %v", err)
		default:
		}
		return s.Sessions() > 0
	})
	return s, stop
}

// queueClient returns a queue client on the env's schema whose "ok" jobs
// succeed and "bad" jobs always fail (MaxAttempts decides how often).
func (e *Env) QueueClient(workers int) *queue.Client {
	e.T.Helper()
	c, err := queue.New(e.Pool, queue.Config{
		Schema:       e.Schema,
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: workers}, "other": {MaxWorkers: 2}},
		PollInterval: 200 * time.Millisecond,
		Backoff:      func(int) time.Duration { return time.Millisecond },
		Handlers: map[string]queue.Handler{
			"ok":  queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil }),
			"bad": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return fmt.Errorf("always fails") }),
		},
	})
	require.NoError(e.T, err)
	return c
}

// RunQueue starts c and returns once its workers run (Start), so a test
// that then interrupts the database does not interrupt c's start (Run
// returns an error when the database cannot be reached as it starts). c
// runs until stop or the test's end; stop requires Stop to succeed within
// two minutes and is safe to call twice.
func (e *Env) RunQueue(c *queue.Client) (stop func()) {
	e.T.Helper()
	require.NoError(e.T, c.Start(context.Background()))
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := c.Stop(ctx); err != nil {
				e.T.Errorf("queue client: Stop: %v", err)
			}
		})
	}
	e.T.Cleanup(stop)
	return stop
}

func (e *Env) Count(sql string, args ...any) int {
	e.T.Helper()
	var n int
	require.NoError(e.T, e.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (e *Env) PendingJobs() int {
	return e.Count(`SELECT count(*) FROM ` + e.Table("jobs") + ` WHERE state = 'pending'`)
}

// tableEvents returns every event of the table by id.
func (e *Env) TableEvents() map[int64]events.Event {
	e.T.Helper()
	out := map[int64]events.Event{}
	err := events.Read(context.Background(), e.Pool, e.Schema, events.From{}, func(ev events.Event) error {
		out[ev.ID] = ev
		return nil
	})
	require.NoError(e.T, err)
	return out
}

// collector receives messages of a subscription, decodes and acks them.
type Collector struct {
	mu   sync.Mutex
	msgs []Received
	Done chan struct{}
}

type Received struct {
	Ev  events.Event
	LSN uint64
}

func Collect(t testing.TB, ch <-chan *message.Message) *Collector {
	c := &Collector{Done: make(chan struct{})}
	go func() {
		defer close(c.Done)
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
			c.msgs = append(c.msgs, Received{ev, uint64(lsn)})
			c.mu.Unlock()
			msg.Ack()
		}
	}()
	return c
}

func (c *Collector) Snapshot() []Received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Received(nil), c.msgs...)
}

// checkDelivery asserts: every table event arrived at least once, nothing
// arrived that the table lacks, LSNs never go back except at a redelivery
// (a restart), and per job the first deliveries are in id order.
func CheckDelivery(t testing.TB, got []Received, table map[int64]events.Event) {
	t.Helper()
	seen := map[int64]bool{}
	lastPerJob := map[int64]int64{}
	for _, r := range got {
		want, ok := table[r.Ev.ID]
		require.True(t, ok, "event %d arrived but is not in the table (rolled back?)", r.Ev.ID)
		require.Equal(t, want.JobID, r.Ev.JobID)
		require.Equal(t, want.Type, r.Ev.Type)
		require.True(t, want.At.Equal(r.Ev.At), "event %d at %v, table %v", r.Ev.ID, r.Ev.At, want.At)
		if seen[r.Ev.ID] {
			continue
		}
		seen[r.Ev.ID] = true
		require.Greater(t, r.Ev.ID, lastPerJob[r.Ev.JobID], "job %d: event %d after %d", r.Ev.JobID, r.Ev.ID, lastPerJob[r.Ev.JobID])
		lastPerJob[r.Ev.JobID] = r.Ev.ID
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

func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDelivered waits until every event of the table arrived. On timeout
// it fails the test naming the missing events and where the slot stands.
func (e *Env) WaitDelivered(col *Collector, d time.Duration) map[int64]events.Event {
	e.T.Helper()
	deadline := time.Now().Add(d)
	for {
		table := e.TableEvents()
		got := col.Snapshot()
		seen := map[int64]bool{}
		for _, r := range got {
			seen[r.Ev.ID] = true
		}
		var missing []events.Event
		for id, ev := range table {
			if !seen[id] {
				missing = append(missing, ev)
			}
		}
		if len(missing) == 0 {
			return table
		}
		if time.Now().After(deadline) {
			sort.Slice(missing, func(i, j int) bool { return missing[i].ID < missing[j].ID })
			var lines []string
			for i, ev := range missing {
				if i == 20 {
					lines = append(lines, fmt.Sprintf("... and %d more", len(missing)-i))
					break
				}
				lines = append(lines, fmt.Sprintf("event %d job %d %s at %s", ev.ID, ev.JobID, ev.Type, ev.At.Format(time.RFC3339Nano)))
			}
			e.T.Fatalf("timed out after %s waiting for all events delivered: %d of %d missing (%d messages received)\n%s\n%s",
				d, len(missing), len(table), len(got), strings.Join(lines, "\n"), e.slotState())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slotState describes the env's slot and the server's WAL position, for a
// failure message.
func (e *Env) slotState() string {
	var state string
	err := e.Pool.QueryRow(context.Background(), `
SELECT format('slot %s active %s pid %s confirmed_flush_lsn %s restart_lsn %s; server wal %s; walsender %s',
	s.slot_name, s.active, s.active_pid, s.confirmed_flush_lsn, s.restart_lsn, pg_current_wal_lsn(),
	coalesce((SELECT format('state %s sent %s flush %s wait %s/%s', r.state, r.sent_lsn, r.flush_lsn, a.wait_event_type, a.wait_event)
		FROM pg_stat_replication r JOIN pg_stat_activity a USING (pid) WHERE r.pid = s.active_pid), 'none'))
FROM pg_replication_slots s WHERE s.slot_name = $1`, e.Slot).Scan(&state)
	if err != nil {
		return fmt.Sprintf("slot %s: %v", e.Slot, err)
	}
	return state
}

// produce enqueues small batches of jobs until stop is called; errors (a
// server restarting) are retried. It returns how many batches went in.
func (e *Env) Produce(c *queue.Client) (stop func() int64) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		jobs := make([]queue.NewJob, 10)
		for i := range jobs {
			jobs[i] = queue.NewJob{Kind: "ok"}
		}
		for ctx.Err() == nil {
			// Not ctx: a call cancelled mid-commit can still commit on the
			// server after stop returns, behind the caller's final snapshot.
			// Each call finishes, so stop leaves nothing in flight.
			if _, err := c.EnqueueMany(context.Background(), jobs); err == nil {
				n.Add(1)
			}
			select {
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	})
	return func() int64 { cancel(); wg.Wait(); return n.Load() }
}
