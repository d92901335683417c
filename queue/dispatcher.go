package queue

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/backoff"
)

// Claim error backoff of a dispatcher: doubling from the first to the last,
// jittered.
const (
	claimBackoffFirst = 100 * time.Millisecond
	claimBackoffLast  = 5 * time.Second
)

// maxLeasedClaim caps how many leased jobs one claim starts. They run
// outside the claim transaction (no savepoints, so MaxBatch's limit does not
// apply); a large claim lets thousands of concurrent jobs start in a few
// round trips.
const maxLeasedClaim = 500

// queueLoop claims and runs the jobs of one queue.
type queueLoop struct {
	c     *Client
	queue string
	// first is the queue's claimFirst statement (a wake-up's claim).
	first string
	slots chan struct{}
	log   *zap.Logger

	signal chan struct{} // coalesced wake-ups
	mu     sync.Mutex
	now    string    // source of a pending "look now" wake-up, "" if none
	hintAt time.Time // earliest delayed job we heard of

	// avgNanos is a moving average of handler run time, for the batch size.
	avgNanos atomic.Int64
	// rewind is set when a batch put claimed jobs back (cut short, or its
	// transaction lost): they lie before the claim cursor, so the next claim
	// starts at the head again and they keep their place in claim order.
	rewind atomic.Bool

	handlers sync.WaitGroup
	// freed is signalled when a leased job frees its slot (awaitFreeSlots).
	freed chan struct{}
	// completing counts leased jobs whose handler succeeded and whose
	// grouped completion is not written yet (leased.go).
	completing atomic.Int64

	pause pauseState // pause.go

	// lookSeq, with test signals on, is the count of looks tests had asked
	// for (testSignals.looksAsked) when the last look began.
	lookSeq int64
}

func newQueueLoop(c *Client, queue string, qc QueueConfig) *queueLoop {
	return &queueLoop{
		c:      c,
		queue:  queue,
		first:  c.sql.claimFirst(queue),
		slots:  make(chan struct{}, qc.MaxWorkers),
		signal: make(chan struct{}, 1),
		freed:  make(chan struct{}, 1),
		log:    c.log.Named("worker").With(zap.String("queue", queue)),
	}
}

// hintLook: a delayed job's NOTIFY (its due time in ms, as of the
// producer's statement) that arrives with more than this left before the
// job is due makes the loop look at the queue, which gives the due time to
// the database's clock and costs one claim; a nearer one arms the timer as
// it is.
const hintLook = 5 * time.Millisecond

// wake asks the loop to look now (delay 0) or to look by now+delay.
func (l *queueLoop) wake(source string, delay time.Duration) {
	l.mu.Lock()
	if delay <= 0 {
		if l.now == "" || source == sourceResync || source == sourceReleased {
			l.now = source
		}
	} else if at := time.Now().Add(delay); l.hintAt.IsZero() || at.Before(l.hintAt) {
		l.hintAt = at
	}
	l.mu.Unlock()
	select {
	case l.signal <- struct{}{}:
	default:
	}
}

// takeWake returns the pending look-now source ("" if none) and the earliest
// delayed hint, clearing both.
func (l *queueLoop) takeWake() (string, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	src, at := l.now, l.hintAt
	l.hintAt = time.Time{}
	l.clearNow()
	return src, at
}

// takeReleased clears a pending released look-now (takeWake's), reporting
// whether there was one; the delayed hint stays.
func (l *queueLoop) takeReleased() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.now != sourceReleased {
		return false
	}
	l.clearNow()
	return true
}

// clearNow takes the pending look-now, if any (l.mu held): with test
// signals on, a look begins after the looks asked so far.
func (l *queueLoop) clearNow() {
	if ts := l.c.signals; ts != nil && l.now != "" {
		l.lookSeq = ts.looksAsked.Load()
	}
	l.now = ""
}

// loopState is what the dispatcher carries from one turn to the next.
type loopState struct {
	source string    // why the next look happens
	nextAt time.Time // earliest future run_after known
	// nextSpent: nextAt is not known (at start, after a resume) or was
	// cleared when its timer (or the poll) fired, and no look that found
	// nothing due has read it since.
	nextSpent bool
	// lostLookAt: while busy, the next look for lost attempts
	// (claimRecovered) is due then: at least one every PollInterval.
	lostLookAt time.Time
	errBackoff backoff.Backoff // claim errors
	waiter     int             // waiter state as last written
	cursor     *claimCursor    // where the last claim ended, while a backlog lasts
	sinceHead  int             // claims in a row that started at the cursor
	rate       rateWindow      // jobs found per window: is a stream running?
	lingerTill time.Time       // marked busy by a stream of jobs: look on our own until then
	stream     streamTx        // a stream's empty claim transaction, kept for the next look
	claimed    int             // jobs claimed, counted only with test signals on
	// leasedFirst: the last batch was leased (or none yet, with leased
	// kinds): the next claim tries claimLeased, with no transaction, first.
	leasedFirst bool
	// tookAll: the last claim started fewer leased jobs than it asked for,
	// so no other leased job was due.
	tookAll bool
	// partial: the last claim locked fewer held jobs than it asked for (more
	// than one), so no other job was due when it ran.
	partial bool
}

// dispatch is the loop: take a free slot, claim jobs, hand them to an
// executor goroutine; when nothing is due, mark the queue as waited on and
// sleep until a wake-up, the earliest known delayed job, or the poll
// interval.
func (l *queueLoop) dispatch(ctx, hardCtx context.Context, done func()) {
	s := &loopState{source: sourceStart, errBackoff: backoff.Backoff{Min: claimBackoffFirst, Max: claimBackoffLast}, waiter: waiterUnknown,
		leasedFirst: len(l.c.cfg.LeasedKinds) > 0, nextSpent: true}
	l.loop(ctx, hardCtx, s, nil, done)
}

// loop is dispatch's loop, in whichever goroutine runs it now: a wake-up's
// batch of one job runs in the goroutine that claimed it, and the loop goes
// on in a new one (handOver), which first settles that batch (started).
// done is called once, when the loop ends.
func (l *queueLoop) loop(ctx, hardCtx context.Context, s *loopState, started *batch, done func()) {
	moved := false
	defer func() {
		if !moved {
			s.stream.drop()
			done()
		}
	}()
	if started != nil && !l.settle(ctx, s, started) {
		return
	}
	for {
		if !l.takeSlot(ctx, s) {
			return
		}
		if l.pause.isPaused() {
			s.stream.drop()
			<-l.slots
			if !l.waitWhilePaused(ctx, s) {
				return
			}
			continue
		}
		b, next, err := l.claimNext(ctx, s)
		if err != nil {
			<-l.slots
			if ctx.Err() != nil || !l.backOff(ctx, s, err) {
				return
			}
			continue
		}
		s.errBackoff.Reset()
		if b != nil {
			if l.prepare(s, b) {
				moved = true
				l.handOver(ctx, hardCtx, s, b, done)
				return
			}
			l.handlers.Add(1)
			go l.runBatch(hardCtx, b)
			if !l.settle(ctx, s, b) {
				return
			}
			continue
		}
		<-l.slots
		asked := s.stream.open == nil // else the look did not ask for the next delayed job
		if asked {
			s.nextAt, s.nextSpent = next, false
		}
		if !s.lingerTill.IsZero() {
			if l.streaming(s, time.Now()) {
				// Jobs keep arriving and their producers do not notify
				// us: look again shortly.
				if !l.linger(ctx, s) {
					return
				}
				continue
			}
			s.lingerTill = time.Time{} // the stream ended: idle through the barrier
			if !asked {
				// One more look, which asks for the earliest delayed
				// job to sleep on.
				s.stream.drop()
				continue
			}
		}
		if idle, ok := l.goIdle(ctx, s); !ok {
			return
		} else if !idle {
			continue
		}
		if !l.waitForWork(ctx, s) {
			return
		}
	}
}

// leasedFetchCooldown is how long a leased claim under a backlog waits for
// more free slots when too few are free (fewSlotsFree; River's
// FetchCooldown).
const leasedFetchCooldown = time.Millisecond

// fewSlotsFree reports whether a leased claim under a backlog should wait
// for more free slots: fewer than half are free (counting the one taken for
// the claim), and fewer than a full claim (maxLeasedClaim). With thousands
// of slots, a claim with hundreds free takes as many jobs as it may
// already: waiting would only delay it.
func (l *queueLoop) fewSlotsFree() bool {
	return cap(l.slots)-len(l.slots)+1 < min(cap(l.slots)/2, maxLeasedClaim)
}

// awaitFreeSlots waits until enough slots are free (fewSlotsFree) or
// leasedFetchCooldown passed, whichever is first: short handlers free
// their slots in microseconds, and a fixed cooldown would then cost more
// than the claim. false when ctx ended first.
func (l *queueLoop) awaitFreeSlots(ctx context.Context) bool {
	if ts := l.c.signals; ts != nil {
		ts.cooldown.signal(cap(l.slots) - len(l.slots) + 1)
	}
	t := time.NewTimer(leasedFetchCooldown)
	defer t.Stop()
	for l.fewSlotsFree() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-l.freed:
		}
	}
	return true
}

// claimNext claims what the loop should run next: a job whose attempt was
// lost (looked for at start, after a resync, a release or a poll), else a
// batch. With nothing due it returns the time of the
// queue's earliest delayed job (zero if none).
func (l *queueLoop) claimNext(ctx context.Context, s *loopState) (*batch, time.Time, error) {
	// Not on every claim: at a start, a reconnect, a release, a poll or a
	// resume, after a recovered job, and while busy at least every
	// PollInterval or when a release was signalled meanwhile (the
	// heartbeat, wakeForLost, signals one when old attempt records exist):
	// a lost job is hidden from the usual claims, and a backlog would keep
	// it waiting to its end.
	lookLost := false
	switch s.source {
	case sourceStart, sourceResync, sourceReleased, sourcePoll, sourceRecovered, sourceResumed:
		lookLost = true
	case sourceBusy:
		lookLost = !s.lostLookAt.IsZero() && !time.Now().Before(s.lostLookAt) || l.takeReleased()
	}
	if lookLost {
		s.lostLookAt = time.Now().Add(l.c.cfg.PollInterval)
		s.stream.drop()
		b, err := l.c.claimRecovered(ctx, l.queue)
		if err != nil || b != nil {
			if b != nil {
				s.source = sourceRecovered
			}
			return b, time.Time{}, err
		}
		if s.source == sourceRecovered {
			// The last lost attempt is rerunning: claim as after any job,
			// from the head.
			s.source, s.cursor = sourceBusy, nil
		}
	}
	// Batch when there is a backlog (the last look found work, or every
	// slot is busy): one dispatcher claims for all slots, so one job per
	// claim would cap throughput at one round trip per job. A fresh wake-up
	// takes one job.
	n := 1
	if s.source == sourceBusy || len(l.slots) == cap(l.slots) {
		n = l.batchSize()
	}
	if l.rewind.Swap(false) {
		s.cursor = nil
	}
	var after *claimCursor
	if s.source == sourceBusy && s.cursor != nil && s.sinceHead < headEvery {
		after = s.cursor
		s.sinceHead++
	} else {
		s.sinceHead = 0
	}
	leasedN, ok := l.leasedClaimSize(ctx, s)
	if !ok {
		return nil, time.Time{}, ctx.Err()
	}
	// A look of a stream keeps its transaction if it finds nothing.
	s.stream.keep = s.source == sourceBusy && !s.lingerTill.IsZero() && l.streaming(s, time.Now())
	// A wake-up (not a look after work) tries claimFirst before the walk.
	first := ""
	if s.source != sourceBusy {
		first = l.first
	}
	b, next, err := l.c.claim(ctx, l.queue, n, leasedN, after, s.leasedFirst, first, &s.stream)
	s.cursor = nil
	s.tookAll = b != nil && b.started && len(b.jobs) < leasedN
	s.partial = b != nil && !b.leased && n > 1 && len(b.jobs) < n
	if b != nil && leasedN > 0 {
		s.leasedFirst = b.leased
	}
	if b != nil && n > 1 && len(b.jobs) >= n {
		// Only a full batch of a backlog says that more jobs follow it: after
		// a partial one, a claim from the cursor would find nothing and
		// fall back to the head, one more statement per claim.
		last := &b.jobs[len(b.jobs)-1].job
		s.cursor = &claimCursor{priority: int16(last.Priority), runAfter: last.RunAfter, id: last.ID}
	}
	return b, next, err
}

// leasedClaimSize is how many leased jobs the next claim may take (0 with
// no leased kinds); false means ctx ended while it waited for slots.
func (l *queueLoop) leasedClaimSize(ctx context.Context, s *loopState) (int, bool) {
	if len(l.c.cfg.LeasedKinds) == 0 {
		return 0, true
	}
	if s.source == sourceBusy && l.fewSlotsFree() {
		// A backlog with most slots busy: slots free one at a time as
		// leased jobs end, and claiming at once would take one job per
		// claim (and per commit). Let a few more free first.
		if !l.awaitFreeSlots(ctx) {
			return 0, false
		}
	}
	// Leased jobs each take a slot: as many as are free (with the one
	// taken for this claim).
	return min(maxLeasedClaim, cap(l.slots)-len(l.slots)+1), true
}

// backOff logs a claim error and sleeps the growing claim backoff; false
// means ctx is done.
func (l *queueLoop) backOff(ctx context.Context, s *loopState, err error) bool {
	wait := s.errBackoff.Next()
	l.log.Warn("claim failed", zap.Error(err), zap.Duration("backoff", wait))
	l.c.metrics.claimErrors.WithLabelValues(l.c.metrics.labels.queue(l.queue)).Inc()
	s.waiter = waiterUnknown
	return sleep(ctx, wait)
}

// handOff bounds how long the dispatcher, after a wake-up claimed a single
// job, waits for that job's handler to start before its next look: the
// look (a claim round trip, usually empty on a quiet queue) would compete
// with the executor's attempt record and the handler for two cores just
// when the job's latency is being paid (a leased job's claim started it;
// a client whose kinds are all leased usually sleeps after such a claim,
// with no look to wait). The executor usually starts the
// handler within half a millisecond. In one invocation at 200 jobs/s with
// half the jobs waited for (by job id), those jobs' p50 was 0.54 ms against
// 0.61-0.63 and their p90 0.81 against 1.01 (docs/benchmarks.md).
// TestWakeUpClaimWaitsForItsHandler.
const handOff = 2 * time.Millisecond

// prepare counts b's claim and readies the loop's state for it; true
// means b is a wake-up's claim of one job, whose handler starts before the
// next look (handOff).
func (l *queueLoop) prepare(s *loopState, b *batch) bool {
	l.c.metrics.claims.WithLabelValues(l.queue, s.source).Add(float64(len(b.jobs)))
	// A job a wake-up claimed alone (the queue was quiet): the next look
	// waits for its handler to start (handOff), held or leased.
	if s.source != sourceBusy && len(b.jobs) == 1 {
		b.firstStarted = make(chan struct{})
	}
	if l.c.signals != nil {
		s.claimed += len(b.jobs)
	}
	if b.lost == nil {
		s.source = sourceBusy
	} // else sourceRecovered: the next look is for the next lost attempt
	if b.leased {
		// Each leased job runs on its own and holds a slot; the claim sized
		// the batch to the free ones.
		for range len(b.jobs) - 1 {
			l.slots <- struct{}{}
		}
	}
	return b.firstStarted != nil
}

// handOver runs b in this goroutine and the loop on in a new one: the
// job's handler starts without waiting for a new goroutine to be scheduled
// (45-57 µs on the wake-up's path on a 2-core machine, docs/benchmarks.md);
// the loop's next look waits for that start anyway.
func (l *queueLoop) handOver(ctx, hardCtx context.Context, s *loopState, b *batch, done func()) {
	l.handlers.Add(1)
	go l.loop(ctx, hardCtx, s, b, done)
	l.runBatch(hardCtx, b)
}

// runBatch executes b; l.handlers counts it.
func (l *queueLoop) runBatch(hardCtx context.Context, b *batch) {
	defer l.handlers.Done()
	if b.leased {
		l.c.executeLeased(hardCtx, b, l) // signals b's first start itself
		return
	}
	defer b.signalStarted()
	b.freeSlot = sync.OnceFunc(func() { <-l.slots })
	defer b.freeSlot()
	l.c.execute(hardCtx, b, l)
}

// settle follows b's start in the loop: it waits for a wake-up's first
// handler to start (handOff), marks the loop busy when saturated, and when
// the claim took every due leased job sleeps until a wake-up. false means
// ctx is done.
func (l *queueLoop) settle(ctx context.Context, s *loopState, b *batch) bool {
	if b.firstStarted != nil {
		d := handOff
		if l.c.handOff > 0 {
			d = l.c.handOff
		}
		t := time.NewTimer(d)
		select {
		case <-b.firstStarted:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	stream := s.rate.add(len(b.jobs), time.Now())
	if stream {
		s.lingerTill = time.Now().Add(streamLinger)
	}
	if s.waiter != waiterBusy && ((len(l.slots) == cap(l.slots) && !s.partial) || stream) {
		// Saturated: every slot is busy, so producers need not wake us (we
		// claim again as soon as a slot frees), unless the claim took fewer
		// jobs than it asked for: nothing else was due, and the look after
		// this batch will most likely find nothing and sleep again (with
		// one slot, a job at a time, unmarking would cost three statements
		// per job: the unmark, the mark and the barrier). Or a stream: jobs arrive
		// faster than streamRate, each with a NOTIFY and its commit-time
		// global lock; we look on our own while the stream lasts instead.
		// Otherwise the idle mark stays: unmarking and re-marking around
		// every job would cost four statements per job, and a mark that
		// stayed up needs no barrier to sleep again.
		if l.c.setWaiter(ctx, l.queue, false) == nil {
			s.waiter = waiterBusy
		} else {
			s.waiter = waiterUnknown
		}
	}
	if s.tookAll && s.waiter == waiterIdle && s.lingerTill.IsZero() && l.c.onlyLeased && !s.nextSpent {
		// The claim took every due job, producers notify us and the timer
		// is set for the next delayed job known: a look now would find
		// nothing. Sleep until a wake-up.
		return l.waitForWork(ctx, s)
	}
	return true
}

// goIdle marks the loop idle and passes the idle barrier before it sleeps.
// idle false means: look again now (the barrier passed, so a producer that
// skipped its NOTIFY may have committed). ok false means ctx is done.
func (l *queueLoop) goIdle(ctx context.Context, s *loopState) (idle, ok bool) {
	if s.waiter == waiterBusy || s.waiter == waiterUnknown {
		if err := l.c.setWaiter(ctx, l.queue, true); err != nil {
			if ctx.Err() != nil {
				return false, false
			}
			l.log.Warn("could not mark the queue as waited on", zap.Error(err))
		} else {
			s.waiter = waiterMarked
		}
	}
	if s.waiter == waiterMarked {
		passed, err := l.c.idleBarrier(ctx, l.queue)
		if err != nil && ctx.Err() != nil {
			return false, false
		}
		if passed {
			s.waiter = waiterIdle
			s.source = sourceBusy
			return false, true
		}
	}
	return true, true
}

// waitForWork sleeps until a wake-up, the earliest known delayed job, the
// poll interval, or (while not past the idle barrier) markedRecheck, and
// sets s.source to what ended the wait. false means ctx is done.
func (l *queueLoop) waitForWork(ctx context.Context, s *loopState) bool {
	defer func() {
		if s.source == sourceScheduled || s.source == sourcePoll || s.source == sourceRecheck {
			s.nextAt, s.nextSpent = time.Time{}, true
		}
	}()
	for {
		src, hint := l.takeWake()
		if !hint.IsZero() && (s.nextAt.IsZero() || hint.Before(s.nextAt)) {
			s.nextAt = hint
			if src == "" && time.Until(hint) > hintLook {
				// The hint is late by the NOTIFY's trip and rounded up
				// to the ms: look, and time the job by the database.
				src = sourceHinted
			}
		}
		if src != "" {
			s.source = src
			if src == sourceResync {
				// The waiters table may have been emptied by a restart.
				s.waiter = waiterUnknown
			}
			return true
		}
		wait, why := l.c.cfg.PollInterval, sourcePoll
		if s.waiter != waiterIdle && wait > markedRecheck {
			// Not known to be safe to sleep: producers may not notify.
			wait, why = markedRecheck, sourceRecheck
		}
		if !s.nextAt.IsZero() {
			if d := time.Until(s.nextAt); d < wait {
				wait, why = d, sourceScheduled
			}
		}
		if wait <= 0 {
			s.source = why
			return true
		}
		if ts := l.c.signals; ts != nil {
			if s.waiter == waiterIdle {
				ts.asleep.signal(asleepSignal{queue: l.queue, claimed: s.claimed, lookSeq: l.lookSeq})
			}
			if why == sourceScheduled {
				ts.armed.signal(armedSignal{queue: l.queue, at: s.nextAt})
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-l.signal:
			t.Stop()
			continue // look at what woke us
		case <-t.C:
			s.source = why
			return true
		}
	}
}
