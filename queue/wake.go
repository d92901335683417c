package queue

// The wake-up protocol. Producers NOTIFY only when a worker waits: a worker
// about to sleep marks its (queue, client) row in the waiters table idle,
// then passes the idle barrier (tries the queue's advisory lock exclusively,
// which every producer holds shared from its wake_needed() call until it
// commits) and looks at the queue once more. wake_needed() (migration 0006)
// notifies when it finds an idle row, when it cannot get the lock, or when
// the producer's snapshot may predate the mark (REPEATABLE READ or
// SERIALIZABLE). So every job is either seen by the last look or announced.
// The payload is "queue" or "queue|ms" (the job is due in ms).

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/pgwake/pgwake/notify"
)

// Claim sources: why a worker looked at the database when it claimed a job.
// "poll" claims mean notifications were missed (or jobs were retried from
// another process's failure without its hint reaching us).
const (
	sourceStart     = "start"     // first look after Run started
	sourceNotify    = "notify"    // a NOTIFY for the queue
	sourceResync    = "resync"    // the listener (re)connected
	sourceScheduled = "scheduled" // the timer of a known delayed job fired
	sourceHinted    = "hinted"    // a NOTIFY told of a delayed job due before any we knew of
	sourcePoll      = "poll"      // the poll interval ran out
	sourceBusy      = "busy"      // the previous look found a job
	sourceReleased  = "released"  // jobs of ours went back to pending (rollback, cut batch)
	sourceRecheck   = "recheck"   // a short look while producers that skipped NOTIFY may be in flight
	sourceRecovered = "recovered" // an attempt that began and recorded no outcome
)

// Waiter states of a loop, as last written to the waiters table.
const (
	waiterUnknown = iota
	waiterBusy
	waiterMarked // marked idle, but producers that looked earlier may be in flight
	waiterIdle   // marked idle and the barrier passed: safe to sleep long
)

// markedRecheck is how often a loop marked idle but not yet past the barrier
// looks at the queue.
const markedRecheck = 25 * time.Millisecond

// maxHintDelay caps delays taken from the database or a wake payload, so far
// future jobs cannot overflow a time.Duration.
const maxHintDelay = 100 * 365 * 24 * time.Hour

// onNotify routes a wake-up to the loop of its queue. It runs on the
// listener's goroutine and never blocks.
func (c *Client) onNotify(ev notify.Event) {
	if ev.Resync {
		for _, l := range c.loops {
			l.wake(sourceResync, 0)
		}
		if ts := c.signals; ts != nil {
			ts.listening.signal(struct{}{})
		}
		select {
		case c.pauseResync <- struct{}{}:
		default:
		}
		return
	}
	if strings.HasPrefix(ev.Payload, pausePrefix) || strings.HasPrefix(ev.Payload, resumePrefix) {
		c.onPauseNotify(ev.Payload)
		return
	}
	if strings.HasPrefix(ev.Payload, cancelPrefix) || strings.HasPrefix(ev.Payload, stopPrefix) {
		c.onCancelNotify(ev.Payload)
		return
	}
	queue, delay := parseWake(ev.Payload)
	if l, ok := c.loops[queue]; ok {
		l.wake(sourceNotify, delay)
	}
}

// parseWake splits a wake payload "queue" or "queue|ms".
func parseWake(payload string) (queue string, delay time.Duration) {
	q, ms, ok := strings.Cut(payload, "|")
	if !ok {
		return payload, 0
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return q, 0
	}
	n = min(n, int64(maxHintDelay/time.Millisecond))
	return q, time.Duration(n) * time.Millisecond
}

// setWaiter records whether this client's loop on queue is asleep.
func (c *Client) setWaiter(ctx context.Context, queue string, idle bool) error {
	_, err := c.pool.Exec(ctx, c.sql.setWaiter, queue, c.id, idle)
	if err != nil {
		return fmt.Errorf("set waiter: %w", err)
	}
	return nil
}

func (c *Client) dropWaiters() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.pool.Exec(ctx, c.sql.dropWaiters, c.id); err != nil {
		c.log.Warn("could not remove waiter rows; they expire in 90s", zap.Error(err))
	}
}

// idleBarrier tries, without queueing, the queue's advisory lock that every
// enqueue holds shared until it commits. Getting it means no producer that
// checked for waiters before our idle mark is still in flight.
func (c *Client) idleBarrier(ctx context.Context, queue string) (bool, error) {
	delay := 200 * time.Microsecond
	for i := 0; ; i++ {
		var ok bool
		if err := c.pool.QueryRow(ctx, c.sql.idleBarrier, queue).Scan(&ok); err != nil {
			return false, fmt.Errorf("idle barrier: %w", err)
		}
		if ok || i == 2 {
			return ok, nil
		}
		if !sleep(ctx, delay) {
			return false, ctx.Err()
		}
		delay *= 4
	}
}
