package events_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// relaySink records each message in <schema>.relayed with the relay's name
// and the time its Publish call started (this machine's clock), after
// waiting delay (a slow broker).
type relaySink struct {
	pool   *pgxpool.Pool
	schema string
	relay  string
	delay  time.Duration
}

func (s relaySink) Publish(topic string, msgs ...*message.Message) error {
	began := time.Now()
	ids := make([]int64, len(msgs))
	for i, m := range msgs {
		ev, err := events.Decode(m.Payload)
		if err != nil {
			return err
		}
		ids[i] = ev.ID
	}
	time.Sleep(s.delay)
	_, err := s.pool.Exec(context.Background(), `INSERT INTO `+sqlident.Quote(s.schema, "relayed")+` (relay, event_id, began)
		SELECT $1, e, $3 FROM unnest($2::bigint[]) e`, s.relay, ids, began)
	return err
}

func (relaySink) Close() error { return nil }

// A relay process paused (SIGSTOP) with events in hand, past the server's
// wal_sender_timeout: its walsender ends and the standby takes over the
// slot. Once resumed (SIGCONT), the paused relay must not publish what it
// still held while the standby streams: two relays would publish at once
// (the same events twice, out of order). Every event is delivered.
func TestPausedRelayDoesNotPublishAfterTheStandbyTookOver(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.Pub = e.Slot + "_pub" // the helper's publication name
	_, err := e.Pool.Exec(ctx, `CREATE TABLE `+e.Table("relayed")+` (seq bigserial PRIMARY KEY, relay text NOT NULL, event_id bigint NOT NULL, began timestamptz NOT NULL)`)
	require.NoError(t, err)
	count := func(where string, args ...any) int {
		return e.Count(`SELECT count(*) FROM `+e.Table("relayed")+` WHERE `+where, args...)
	}

	a := startForwarder(t, e, "PGWAKE_TEST_RELAY=A", "PGWAKE_TEST_PUBLISH_DELAY=150ms", "PGWAKE_TEST_WAL_SENDER_TIMEOUT=2s")
	cfgB := e.Config(relaySink{pool: e.Pool, schema: e.Schema, relay: "B"})
	cfgB.MaxBackoff = 300 * time.Millisecond
	b, err := events.New(e.Pool, cfgB)
	require.NoError(t, err)
	stopB := pgtest.RunInBackground(t, "standby relay", b.Run)
	defer stopB()
	waitFor(t, 30*time.Second, "B standing by", b.Standby)

	// Events in transactions of their own, faster than A publishes them.
	const n = 300
	for range n {
		_, err := e.Pool.Exec(ctx, `SELECT `+e.Table("enqueue")+`('k')`)
		require.NoError(t, err)
	}
	waitFor(t, 30*time.Second, "A publishing", func() bool { return count(`relay = 'A'`) >= 5 })
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	paused, pausedAt := true, time.Now()
	defer func() {
		if paused {
			_ = a.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	byA := count(`relay = 'A'`)
	require.Less(t, byA, n, "A published everything before its pause: nothing in hand")
	waitFor(t, 60*time.Second, "B taking over", func() bool { return b.Sessions() > 0 })
	tookOver := time.Since(pausedAt)
	waitFor(t, 60*time.Second, "B publishing the rest", func() bool {
		return e.Count(`SELECT count(DISTINCT event_id) FROM `+e.Table("relayed")) == n
	})
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	paused = false
	resumed := time.Now()
	// A notices its walsender is gone and stands by (the slot streams to
	// B): give it time to publish anything it would.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	late := count(`relay = 'A' AND began > $1`, resumed)
	t.Logf("A published %d events before its pause, %d in Publish calls it started after its resume; B %d (took over %s after the pause)", byA, late, count(`relay = 'B'`), tookOver)
	require.Zero(t, late, "the resumed relay published while the standby streamed")
	require.Equal(t, n, e.Count(`SELECT count(DISTINCT event_id) FROM `+e.Table("relayed")))
}
