package queue

// Paused queues. A queue is paused while it has a row in paused_queues
// (migration 0012): enqueues still go in, running jobs finish, and no
// client's dispatcher claims from it. PauseQueue and ResumeQueue NOTIFY the
// wake channel ("!pause|queue", "!resume|queue") so every running client
// obeys at once; each client also reads the table when it starts and every
// PollInterval, so a missed notification costs at most a poll.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// Notification payload prefixes of pause changes ('!' starts no queue name).
const (
	pausePrefix  = "!pause|"
	resumePrefix = "!resume|"
)

// sourceResumed is the claim source of a dispatcher's first look after its
// queue was resumed.
const sourceResumed = "resumed"

// QueueState is a queue as Queues lists it.
type QueueState struct {
	Queue string
	// Paused is true while the queue is paused; PausedAt is when (zero when
	// not paused).
	Paused   bool
	PausedAt time.Time
}

// PauseQueue pauses queue in every client on the schema: they stop
// claiming its jobs when its notification arrives (at their next poll,
// PollInterval, if it is lost; docs/pause.md gives measured times),
// running jobs finish, and enqueues still go in.
// Pausing a paused queue does nothing more. The pause is stored in the
// database and outlives every client.
func (c *Client) PauseQueue(ctx context.Context, queue string) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.PauseQueueTx(ctx, tx, queue) })
}

// PauseQueueTx is PauseQueue in the caller's transaction: the pause (and its
// notification) take effect when tx commits.
func (c *Client) PauseQueueTx(ctx context.Context, tx pgx.Tx, queue string) error {
	if err := ValidateQueue(queue); err != nil {
		return fmt.Errorf("queue: pause: %w", err)
	}
	if _, err := tx.Exec(ctx, c.sql.periodic.pause, queue, c.channel); err != nil {
		return fmt.Errorf("queue: pause %s: %w", queue, c.notMigrated(err))
	}
	return nil
}

// ResumeQueue ends queue's pause: every client claims its jobs again.
// Resuming a queue that is not paused does nothing.
func (c *Client) ResumeQueue(ctx context.Context, queue string) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.ResumeQueueTx(ctx, tx, queue) })
}

// ResumeQueueTx is ResumeQueue in the caller's transaction.
func (c *Client) ResumeQueueTx(ctx context.Context, tx pgx.Tx, queue string) error {
	if err := ValidateQueue(queue); err != nil {
		return fmt.Errorf("queue: resume: %w", err)
	}
	if _, err := tx.Exec(ctx, c.sql.periodic.resume, queue, c.channel); err != nil {
		return fmt.Errorf("queue: resume %s: %w", queue, c.notMigrated(err))
	}
	return nil
}

// Queues lists the queues that are paused or have pending jobs, in name
// order, with their pause state.
func (c *Client) Queues(ctx context.Context) ([]QueueState, error) {
	rows, err := c.pool.Query(ctx, c.sql.periodic.queues)
	if err != nil {
		return nil, fmt.Errorf("queue: list queues: %w", c.notMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueState, error) {
		var q QueueState
		var at *time.Time
		if err := r.Scan(&q.Queue, &at); err != nil {
			return q, err
		}
		if at != nil {
			q.Paused, q.PausedAt = true, *at
		}
		return q, nil
	})
	if err != nil {
		return nil, fmt.Errorf("queue: list queues: %w", c.notMigrated(err))
	}
	return out, nil
}

// pauseState is whether a dispatcher's queue is paused, as this client
// knows it.
type pauseState struct {
	mu     sync.Mutex
	paused bool
}

func (p *pauseState) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// onPauseNotify answers a pause or resume notification by reading the
// paused queues again, not by trusting it: NOTIFY needs no privilege, so
// any role that can connect could send one (TestSpoofedControlsAreIgnored).
// It runs on the listener's goroutine and never blocks.
func (c *Client) onPauseNotify(payload string) {
	q := strings.TrimPrefix(strings.TrimPrefix(payload, pausePrefix), resumePrefix)
	if _, ok := c.loops[q]; !ok {
		return
	}
	select {
	case c.pauseResync <- struct{}{}:
	default: // a read is due already
	}
}

// setPaused records the queue's pause state as read from paused_queues
// (only pausePoll's goroutine reads it, notifications included, so reads
// apply in order). A resume wakes the dispatcher.
func (l *queueLoop) setPaused(paused bool) {
	p := &l.pause
	p.mu.Lock()
	was := p.paused
	p.paused = paused
	p.mu.Unlock()
	g := 0.0
	if paused {
		g = 1
	}
	l.c.metrics.paused.WithLabelValues(l.queue).Set(g)
	if was == paused {
		return
	}
	if paused {
		l.log.Info("queue paused")
	} else {
		l.log.Info("queue resumed")
		l.wake(sourceResumed, 0)
	}
}

// loadPaused reads which of the client's queues are paused and applies it.
func (c *Client) loadPaused(ctx context.Context) error {
	if len(c.loops) == 0 {
		return nil
	}
	queues := make([]string, 0, len(c.loops))
	for q := range c.loops {
		queues = append(queues, q)
	}
	rows, err := c.pool.Query(ctx, c.sql.periodic.paused, queues)
	if err != nil {
		return fmt.Errorf("queue: read paused queues: %w", err)
	}
	paused, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("queue: read paused queues: %w", err)
	}
	set := make(map[string]bool, len(paused))
	for _, q := range paused {
		set[q] = true
	}
	for q, l := range c.loops {
		l.setPaused(set[q])
	}
	return nil
}

// pausePoll re-reads the pause state every PollInterval, and at once when
// the listener reconnects, until ctx is done.
func (c *Client) pausePoll(ctx context.Context) {
	t := time.NewTicker(c.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.pauseResync:
		}
		if err := c.loadPaused(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("reading paused queues failed", zap.Error(err))
		}
	}
}

// waitWhilePaused holds the dispatcher while its queue is paused: it
// claims nothing until a resume (or ctx ends: false).
func (l *queueLoop) waitWhilePaused(ctx context.Context, s *loopState) bool {
	if !l.pause.isPaused() {
		return true
	}
	// Not waiting for jobs: producers need not NOTIFY for this queue.
	if s.waiter != waiterBusy && l.c.setWaiter(ctx, l.queue, false) == nil {
		s.waiter = waiterBusy
	}
	for l.pause.isPaused() {
		if ts := l.c.signals; ts != nil {
			ts.pausedLook.signal(l.queue)
		}
		t := time.NewTimer(l.c.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-l.signal: // a resume, or an enqueue's wake-up: look at the state again
			t.Stop()
		case <-t.C:
		}
	}
	l.takeWake()
	s.source, s.nextAt, s.nextSpent, s.cursor = sourceResumed, time.Time{}, true, nil
	return true
}
