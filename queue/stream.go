package queue

import (
	"context"
	"time"
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
// NOTIFY, the fastest path for one job.
const (
	streamRate   = 500 // jobs a second
	streamWindow = 20 * time.Millisecond
	streamPoll   = 500 * time.Microsecond
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

// linger waits streamPoll (or until a wake-up) before the next look of a
// loop marked busy by a stream. false means ctx is done.
func (l *queueLoop) linger(ctx context.Context, s *loopState) bool {
	t := time.NewTimer(streamPoll)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-l.signal:
	case <-t.C:
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
