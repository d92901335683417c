package queue

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Streams of jobs (issue 12): at a steady rate, a loop below saturation is
// woken for each job and goes back to sleep at once, so its idle mark stays
// up and every enqueue takes the NOTIFY path, whose commits serialise on a
// global lock. That lock costs producers little at a few hundred jobs a
// second and a lot at a thousand (their commits queue behind it). A loop
// whose last streamWindow found jobs at streamRate or faster marks itself
// busy and looks on its own every streamPoll while the rate holds (and
// streamLinger has not passed since the last job found), then goes idle
// through the barrier as usual. Below streamRate every job is woken by its
// NOTIFY, the fastest path for one job. The poll sleeps with sleepFor: a Go
// timer of 500 us slept about 1.1 ms. A poll of 250 us rather than 500
// took the p50 at 800 and 1,000 jobs/s from 1.00 and 1.05 ms to 0.82 and
// 0.91 (medians of three alternated rounds; 125 us was no better), at no
// cost to the producers' commits (docs/benchmarks.md).
const (
	streamRate   = 500 // jobs a second
	streamWindow = 20 * time.Millisecond
	streamPoll   = 250 * time.Microsecond
	streamLinger = 20 * time.Millisecond
)

// rateWindow counts the jobs a loop finds per streamWindow.
type rateWindow struct {
	start time.Time
	jobs  int
	fast  bool // the last complete window found streamRate or more
}

// add counts n jobs found at now and reports whether they arrive as a
// stream, judged on the last complete window (a window that lasted longer,
// because nothing was found for a while, is judged over its whole length).
func (w *rateWindow) add(n int, now time.Time) bool {
	if w.start.IsZero() {
		w.start = now
	}
	if el := now.Sub(w.start); el >= streamWindow {
		w.fast = float64(w.jobs) >= streamRate*el.Seconds()
		w.start, w.jobs = now, 0
	}
	w.jobs += n
	return w.fast
}

// streaming reports whether the loop is marked busy by a stream that has
// not ended at now: it looks on its own.
func (l *queueLoop) streaming(s *loopState, now time.Time) bool {
	return s.waiter == waiterBusy && now.Before(s.lingerTill) && s.rate.add(0, now)
}

// takeSlot takes a free slot for the next look, false when ctx ended first.
// A stream's open transaction is not kept while the loop waits for one.
func (l *queueLoop) takeSlot(ctx context.Context, s *loopState) bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
	}
	s.stream.drop()
	select {
	case <-ctx.Done():
		return false
	case l.slots <- struct{}{}:
		return true
	}
}

// linger waits streamPoll (or until a wake-up) before the next look of a
// loop marked busy by a stream. false means ctx is done.
func (l *queueLoop) linger(ctx context.Context, s *loopState) bool {
	select {
	case <-ctx.Done():
		return false
	case <-l.signal:
	case <-sleepFor(streamPoll):
	}
	src, hint := l.takeWake()
	if !hint.IsZero() && (s.nextAt.IsZero() || hint.Before(s.nextAt)) {
		s.nextAt = hint
	}
	s.source = sourceBusy
	if src == sourceResync || src == sourceReleased {
		s.source = src
	}
	if src == sourceResync {
		s.waiter = waiterUnknown
	}
	return true
}

// streamTx is the empty claim transaction a look of a stream keeps open for
// the next one (claim): the next look's round trip rolls it back and begins
// its own (ROLLBACK AND CHAIN, which also gives the claim a new now()), so
// an empty look of a stream costs one round trip, not two (the claim, then
// the earliest delayed job with the ROLLBACK). The earliest delayed job
// matters only to sleep on: a loop asks for it in a look of its own
// before it goes idle (dispatch). The transaction holds no lock (nothing
// was claimed) and, at read committed, no snapshot.
type streamTx struct {
	keep bool   // the next look is of a stream: keep it open if empty
	open *batch // the transaction kept open, nil if none
}

// drop rolls back the transaction kept open, if any, and returns its
// connection to the pool. st may be nil.
func (st *streamTx) drop() {
	if st != nil && st.open != nil {
		st.open.release()
		st.open = nil
	}
}

// chainLook is the statement that ends a transaction kept open by a
// stream's empty look and begins the next look's (streamTx).
const chainLook = `ROLLBACK AND CHAIN`

// beginLook is beginClaim, on the connection of st's open transaction when
// there is one: pb then rolls it back and begins the next (chainLook).
func (c *Client) beginLook(ctx context.Context, st *streamTx) (*batch, *pgx.Batch, error) {
	if st == nil || st.open == nil {
		return c.beginClaim(ctx)
	}
	b := &batch{conn: st.open.conn, tx: st.open.tx}
	st.open = nil
	pb := &pgx.Batch{}
	pb.Queue(chainLook)
	c.liftIdleTimeout(pb) // a local setting: the rollback ended it
	return b, pb, nil
}
