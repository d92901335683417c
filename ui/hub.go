package ui

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
)

// gapTimeout is how long the feed waits for an event id it skipped (its
// transaction had not committed when a later one had) before it gives it
// up as rolled back.
const gapTimeout = 10 * time.Second

// tailMinInterval is the least time between two reads of the event log:
// the notifications of a burst of transactions share one read. At 200
// jobs/s a read every 25 ms sent 35-40 reads a second and as many writes
// (and flushes) to each stream; 50 ms halves both and keeps an event's
// wait for the next read well under the 250 ms the pages promise.
const tailMinInterval = 50 * time.Millisecond

// trailingRead is how long after a read prompted by a notification, or one
// that found events, the feed reads again if nothing prompted a read
// meanwhile. Migration 0017 notifies at most once per 25 ms: a transaction
// that commits within 25 ms after a notified one sends none, and this read
// shows it (as long as its commit took at most the other 25 ms). It is no
// shorter than tailMinInterval, which would hold it back anyway. While
// reads find events the feed keeps reading; once one finds none it waits
// for the next notification.
const trailingRead = 50 * time.Millisecond

// maxGap is the widest run of skipped ids the feed waits for; a wider one
// (a large rolled-back batch) is given up at once.
const maxGap = 10000

// streamBacklog is the most messages (reads of the event log, counters)
// queued for a stream; one more and the stream is dropped as too slow (its
// page reconnects and resumes from the event log). 256 reads is about 6 s
// of a busy log (a read per 25 ms).
const streamBacklog = 256

// heartbeatInterval refreshes the watcher row (migration 0015 honours a
// heartbeat for 60 s).
const heartbeatInterval = 20 * time.Second

// message is what the hub sends every stream at once: the server-sent
// events of one read of the event log (its job events and the new resume
// point), or of one counters refresh, framed once for all the streams. A
// stream writes it with one Write (and flushes once) unless it must leave
// out job events it replayed itself.
type message struct {
	frames []byte     // the events as written on the wire; shared, read-only
	jobs   []jobFrame // where each job event lies in frames, in order
}

// jobFrame is one job event of a message: its event id and its bytes,
// frames[start:end].
type jobFrame struct {
	evID       int64
	start, end int
}

// appendFrame appends one server-sent event to b: "id: " when hasID,
// "event: ", "data: " (data holds no newline: JSON from encoding/json).
func appendFrame(b []byte, event string, id int64, hasID bool, data []byte) []byte {
	if hasID {
		b = append(b, "id: "...)
		b = strconv.AppendInt(b, id, 10)
		b = append(b, '\n')
	}
	b = append(b, "event: "...)
	b = append(b, event...)
	b = append(b, "\ndata: "...)
	b = append(b, data...)
	return append(b, "\n\n"...)
}

// subscriber is one open event stream.
type subscriber struct {
	ch   chan message
	gone chan struct{} // closed when the hub dropped it (it fell behind)
}

// jobEvent is an event as pages receive it: no data (it may hold an error
// text; the job page shows it).
type jobEvent struct {
	ID      int64           `json:"id"`
	JobID   int64           `json:"job_id"`
	Type    queue.EventType `json:"type"`
	Queue   string          `json:"queue"`
	Kind    string          `json:"kind"`
	Attempt int             `json:"attempt"`
	At      time.Time       `json:"at"`
}

func jobEventOf(e queue.EventInfo) jobEvent {
	return jobEvent{ID: e.ID, JobID: e.JobID, Type: e.Type, Queue: e.Queue, Kind: e.Kind, Attempt: e.Attempt, At: e.At}
}

// sample is one second of the sparkline.
type sample struct {
	At        int64   `json:"at"` // unix seconds
	Succeeded int     `json:"succeeded"`
	Failed    int     `json:"failed"`
	LatencyMS float64 `json:"latency_ms"` // median enqueue-to-success of the second's jobs; 0: none
	lat       []float64
	latStale  bool // lat grew since LatencyMS was taken (at the next counters message)
}

// statsMessage is the "stats" event's data.
type statsMessage struct {
	Queues  []queue.QueueStat `json:"queues"`
	Samples []sample          `json:"samples"`
	At      time.Time         `json:"at"`
}

// hub reads the event log after every notification (and trailingRead
// later, see there) and fans events and counters out to the open streams.
type hub struct {
	cfg       Config
	client    *queue.Client
	log       *zap.Logger
	kick      chan struct{}
	statsKick chan struct{} // a stream opened while the counters were stale
	start     chan struct{} // closed when the feed has started
	startOnce sync.Once

	mu      sync.Mutex
	subs    map[*subscriber]struct{}
	closed  bool                // Run has ended: new streams end at once
	low     int64               // every event id <= low was delivered or given up
	seen    map[int64]bool      // ids above low delivered
	missing map[int64]time.Time // ids above low skipped, since when
	maxSeen int64
	ready   bool
	stats   []byte // the last stats message
	stale   bool   // a refresh was skipped: no stream was open
	samples []sample
	// succ counts the succeeded events of the last minute per whole second
	// (unix) and queue: the counters' SucceededLastMinute, which
	// QueueStats would count from the jobs table at every refresh.
	succ   map[int64]map[string]int64
	enqAt  map[int64]time.Time // enqueue times of recent jobs, for latency
	lastSt time.Time
	statsQ int // QueueStats calls, for tests and docs
	tailQ  int // event log reads
}

func newHub(cfg Config) *hub {
	return &hub{cfg: cfg, client: cfg.Client, log: cfg.Logger.Named("ui"), kick: make(chan struct{}, 1), statsKick: make(chan struct{}, 1), start: make(chan struct{}),
		subs: map[*subscriber]struct{}{}, seen: map[int64]bool{}, missing: map[int64]time.Time{}, enqAt: map[int64]time.Time{},
		succ: map[int64]map[string]int64{}}
}

func (h *hub) poke() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// run registers the watcher, listens and tails until ctx is done.
func (h *hub) run(ctx context.Context) error {
	// Every way out ends the streams, including a cancel while the feed
	// starts (a stream opened then hung for ever: TestRunStopsCleanly in CI).
	defer h.closeAll()
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := "ui-" + hex.EncodeToString(b[:])
	if err := h.client.WatchEvents(ctx, id); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = h.client.UnwatchEvents(uctx, id)
	}()
	if h.cfg.Listener != nil {
		unsub, err := h.cfg.Listener.Subscribe(queue.EventsChannel(h.client.Schema()), func(notify.Event) { h.poke() })
		if err != nil {
			return err
		}
		defer unsub()
	}
	last, err := h.client.LastEventID(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	last = h.abovePruned(ctx, last)
	// The successes of the last minute up to the first event the feed
	// reads; the feed counts the later ones as it reads them.
	seed, err := h.client.EventsPerSecond(ctx, queue.EventSucceeded, time.Now().Add(-time.Minute-time.Second), last)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	h.mu.Lock()
	clear(h.succ)
	for _, s := range seed {
		h.countSucceeded(s.Second, s.Queue, s.Count)
	}
	h.low, h.maxSeen, h.ready = last, last, true
	h.mu.Unlock()
	h.startOnce.Do(func() { close(h.start) })
	h.refreshStats(ctx, time.Now())

	heartbeat := time.NewTicker(heartbeatInterval)
	defer heartbeat.Stop()
	refresh := time.NewTicker(h.cfg.RefreshInterval)
	defer refresh.Stop()
	var statsTimer <-chan time.Time
	var lastTail time.Time
	gapCheck := time.NewTicker(250 * time.Millisecond)
	defer gapCheck.Stop()
	trailing := time.NewTimer(trailingRead)
	trailing.Stop()
	defer trailing.Stop()
	wait := time.NewTimer(tailMinInterval) // reused: no timer made per read
	wait.Stop()
	defer wait.Stop()
	for {
		notified, withStats := false, false
		select {
		case <-ctx.Done():
			return nil
		case <-heartbeat.C:
			if err := h.client.WatchEvents(ctx, id); err != nil && ctx.Err() == nil {
				h.log.Warn("watcher heartbeat failed", zap.Error(err))
			}
			continue
		case <-refresh.C:
			// A missed notification costs at most this long.
			withStats = true
		case <-statsTimer:
			statsTimer = nil
			if time.Since(lastTail) < tailMinInterval {
				// A read now would wait: the counters go alone, not later.
				h.refreshStats(ctx, time.Now())
				continue
			}
			// The counters ride on a read of the log: one message (one
			// write and one flush per stream) for both.
			withStats = true
		case <-h.statsKick:
			h.refreshStats(ctx, time.Now())
			continue
		case <-gapCheck.C:
			h.mu.Lock()
			gaps := len(h.missing) > 0
			h.mu.Unlock()
			if !gaps {
				continue
			}
		case <-trailing.C:
		case <-h.kick:
			notified = true
		}
		// Notifications in a burst share one read.
		if d := tailMinInterval - time.Since(lastTail); d > 0 {
			wait.Reset(d)
			select {
			case <-ctx.Done():
				continue
			case <-wait.C:
			}
			select {
			case <-h.kick:
				notified = true
			default:
			}
		}
		lastTail = time.Now()
		evs, err := h.tail(ctx)
		n := len(evs)
		if notified || n > 0 {
			trailing.Reset(trailingRead)
		}
		if err != nil && ctx.Err() == nil {
			h.log.Warn("reading the event log failed", zap.Error(err))
		}
		if (n > 0 || statsTimer != nil) && !withStats {
			// Counters are owed: sent with this read once due (measured
			// from the start of the read that carried the last ones, so a
			// read every tailMinInterval carries them every other time).
			if d := h.cfg.StatsMinInterval - time.Since(h.lastStatsAt()); d <= 0 {
				withStats, statsTimer = true, nil
			} else if statsTimer == nil {
				statsTimer = time.After(d)
			}
		}
		var st []queue.QueueStat
		if withStats {
			st, withStats = h.readStats(ctx, lastTail)
		}
		h.publish(evs, time.Now(), st, withStats)
	}
}

func (h *hub) lastStatsAt() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastSt
}

// tail reads the events after the highest id seen and the skipped ids.
func (h *hub) tail(ctx context.Context) ([]queue.EventInfo, error) {
	h.mu.Lock()
	after := h.maxSeen
	var missing []int64
	for id := range h.missing {
		missing = append(missing, id)
	}
	h.tailQ++
	h.mu.Unlock()
	var evs []queue.EventInfo
	for {
		page, err := h.client.EventsAfter(ctx, after, queue.MaxJobListLimit)
		if err != nil {
			return nil, err
		}
		evs = append(evs, page...)
		if len(page) < queue.MaxJobListLimit {
			break
		}
		after = page[len(page)-1].ID
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		if len(missing) > queue.MaxJobListLimit {
			missing = missing[:queue.MaxJobListLimit]
		}
		late, err := h.client.EventsByID(ctx, missing)
		if err != nil {
			return nil, err
		}
		evs = append(evs, late...)
		// In id order: a job's events then reach the pages in the order
		// they were written, which set its state from each in turn (a
		// late enqueued after its job's cancelled showed it pending:
		// TestLateEventsReachTheStreamInOrder).
		slices.SortFunc(evs, func(a, b queue.EventInfo) int { return cmp.Compare(a.ID, b.ID) })
	}
	return evs, nil
}

// deliver sends the events not delivered yet to every stream and returns
// how many.
func (h *hub) deliver(evs []queue.EventInfo, now time.Time) int {
	return h.publish(evs, now, nil, false)
}

// publish sends every stream one message: the events of evs not delivered
// yet, each with the resume point valid before it, then a mark with the
// new resume point, then (withStats) the counters st. Each event is
// encoded once whatever the number of streams, and each stream gets one
// message (one write and flush) per read of the log, counters included.
// It returns how many events it sent.
func (h *hub) publish(evs []queue.EventInfo, now time.Time, st []queue.QueueStat, withStats bool) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.collect(evs, now)
	if withStats {
		m.frames = h.appendStats(m.frames, st)
	}
	if len(m.frames) > 0 {
		h.broadcast(m)
	}
	return len(m.jobs)
}

// collect frames the events of evs not delivered yet and advances the
// resume point. Held under h.mu.
func (h *hub) collect(evs []queue.EventInfo, now time.Time) message {
	prev := h.low
	var m message
	for _, e := range evs {
		if e.ID <= h.low || h.seen[e.ID] {
			continue
		}
		if e.ID-h.maxSeen <= maxGap {
			for id := h.maxSeen + 1; id < e.ID; id++ {
				h.missing[id] = now
			}
		}
		delete(h.missing, e.ID)
		h.seen[e.ID] = true
		h.maxSeen = max(h.maxSeen, e.ID)
		h.sample(e)
		start := len(m.frames)
		m.frames = appendJobFrame(m.frames, prev, e)
		m.jobs = append(m.jobs, jobFrame{evID: e.ID, start: start, end: len(m.frames)})
	}
	// Give up skipped ids past the timeout: rolled back, or a transaction
	// open too long (pages show it on reload).
	for id, since := range h.missing {
		if now.Sub(since) > gapTimeout {
			delete(h.missing, id)
		}
	}
	for h.low < h.maxSeen {
		if _, wait := h.missing[h.low+1]; wait {
			break
		}
		delete(h.seen, h.low+1)
		h.low++
	}
	if h.low != prev {
		m.frames = appendFrame(m.frames, "mark", h.low, true, []byte("{}"))
	}
	return m
}

// sample counts e into its second's sparkline sample. Held under h.mu.
func (h *hub) sample(e queue.EventInfo) {
	switch e.Type {
	case queue.EventEnqueued:
		if len(h.enqAt) > 100000 {
			clear(h.enqAt)
		}
		h.enqAt[e.JobID] = e.At
		return
	case queue.EventSucceeded:
		h.countSucceeded(e.At.Unix(), e.Queue, 1)
	case queue.EventFailed:
	default:
		return
	}
	sec := e.At.Unix()
	i := len(h.samples) - 1
	if i < 0 || h.samples[i].At < sec {
		h.samples = append(h.samples, sample{At: sec})
		if len(h.samples) > 120 {
			h.samples = slices.Delete(h.samples, 0, len(h.samples)-120)
		}
		i = len(h.samples) - 1
	} else {
		for i > 0 && h.samples[i].At > sec {
			i--
		}
		if h.samples[i].At != sec {
			return // older than the window's gaps: not worth inserting
		}
	}
	s := &h.samples[i]
	if e.Type == queue.EventFailed {
		s.Failed++
		return
	}
	s.Succeeded++
	if t, ok := h.enqAt[e.JobID]; ok {
		s.lat = append(s.lat, float64(e.At.Sub(t).Microseconds())/1000)
		s.latStale = true
		delete(h.enqAt, e.JobID)
	}
}

// countSucceeded adds n successes of queue q in second sec. Held under
// h.mu.
func (h *hub) countSucceeded(sec int64, q string, n int64) {
	qs := h.succ[sec]
	if qs == nil {
		for old := range h.succ { // bounded while no page asks for counters
			if old < sec-61 {
				delete(h.succ, old)
			}
		}
		qs = map[string]int64{}
		h.succ[sec] = qs
	}
	qs[q] += n
}

// withSucceeded sets each queue's SucceededLastMinute in st to the
// successes the feed counted in the whole seconds after one minute before
// now, and lists the queues that only those successes name (countSucceeded
// forgets the older seconds). Held under h.mu.
func (h *hub) withSucceeded(st []queue.QueueStat, now time.Time) []queue.QueueStat {
	from := now.Add(-time.Minute).Unix()
	per := map[string]int64{}
	for sec, qs := range h.succ {
		if sec <= from {
			continue
		}
		for q, n := range qs {
			per[q] += n
		}
	}
	for i := range st {
		st[i].SucceededLastMinute = per[st[i].Queue]
		delete(per, st[i].Queue)
	}
	if len(per) == 0 {
		return st
	}
	for q, n := range per {
		st = append(st, queue.QueueStat{Queue: q, SucceededLastMinute: n})
	}
	slices.SortFunc(st, func(a, b queue.QueueStat) int { return strings.Compare(a.Queue, b.Queue) })
	return st
}

// medians sets the latency median of the samples whose latencies grew
// since the last counters message: once per message, not per event. Held
// under h.mu.
func (h *hub) medians() {
	for i := range h.samples {
		s := &h.samples[i]
		if s.latStale {
			slices.Sort(s.lat)
			s.LatencyMS = s.lat[len(s.lat)/2]
			s.latStale = false
		}
	}
}

// refreshStats reads the counters and pushes them to every stream; at is
// when the refresh started.
func (h *hub) refreshStats(ctx context.Context, at time.Time) {
	if st, ok := h.readStats(ctx, at); ok {
		h.publish(nil, time.Now(), st, true)
	}
}

// readStats reads the counters. With no stream open it reads nothing (a
// dashboard nobody looks at costs no QueueStats) and marks the counters
// stale; the next stream to open asks for a read. It reports whether it
// read them; at (when the refresh started) is then the last refresh's.
func (h *hub) readStats(ctx context.Context, at time.Time) ([]queue.QueueStat, bool) {
	h.mu.Lock()
	idle := len(h.subs) == 0
	if idle {
		h.stale = true
	}
	h.mu.Unlock()
	if idle {
		return nil, false
	}
	// The feed counts the successes itself (withSucceeded).
	st, err := h.client.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: h.cfg.ExactLimit, SkipSucceeded: true})
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("reading queue stats failed", zap.Error(err))
		}
		return nil, false
	}
	h.mu.Lock()
	h.lastSt = at
	h.mu.Unlock()
	return st, true
}

// appendStats appends to b the "stats" event of the counters st and the
// sparkline, and keeps it for the streams that open next. Held under h.mu.
func (h *hub) appendStats(b []byte, st []queue.QueueStat) []byte {
	h.statsQ++
	h.stale = false
	h.medians()
	st = h.withSucceeded(st, time.Now())
	data, _ := json.Marshal(statsMessage{Queues: st, Samples: h.samples, At: time.Now()})
	h.stats = data
	return appendFrame(b, "stats", 0, false, data)
}

// broadcast sends m to every stream; a stream that fell behind is dropped
// (its page reconnects and resumes from the event log). Held under h.mu.
func (h *hub) broadcast(m message) {
	for s := range h.subs {
		select {
		case s.ch <- m:
		default:
			delete(h.subs, s)
			close(s.gone)
		}
	}
}

// subscribe opens a stream: it returns the subscriber, the resume point
// and the highest event id delivered as of now, and the last stats
// message (nil when stale: a fresh one follows). Events above the resume point may have been delivered already
// (a skipped id holds the resume point back).
func (h *hub) subscribe() (s *subscriber, low, maxSeen int64, stats []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s = &subscriber{ch: make(chan message, streamBacklog), gone: make(chan struct{})}
	if h.closed {
		close(s.gone) // a stream that arrives after Run ended ends too
		return s, h.low, h.maxSeen, h.stats
	}
	h.subs[s] = struct{}{}
	if h.stale {
		// No stale counters: the read asked for here pushes fresh ones.
		select {
		case h.statsKick <- struct{}{}:
		default:
		}
		return s, h.low, h.maxSeen, nil
	}
	return s, h.low, h.maxSeen, h.stats
}

// abovePruned is where the feed starts: the newest event, or the newest
// event prune deleted when above it (the newest events were pruned), so
// that a page of before the start resumed below them is told to reload and
// the pages it renders are not (TestResumeAfterAStartOverPrunedNewestEvents).
func (h *hub) abovePruned(ctx context.Context, last int64) int64 {
	through, err := h.client.EventsPrunedThrough(ctx)
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("could not read how far events were pruned; starting at the newest event", zap.Error(err))
		}
		return last
	}
	return max(last, through)
}

// resumePoint is the current resume point, -1 before the feed started.
func (h *hub) resumePoint() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ready {
		return -1
	}
	return h.low
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		delete(h.subs, s)
		close(s.gone)
	}
}

func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		delete(h.subs, s)
		close(s.gone)
	}
}

// counts returns how many QueueStats and event log reads the hub made.
func (h *hub) counts() (stats, tails int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.statsQ, h.tailQ
}
