package ui

import (
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/pgwake/pgwake/queue"
)

// maxReplay is the most events a reconnecting page is sent from the event
// log; further behind, it is told to reload.
const maxReplay = 20000

// streamWriteTimeout bounds each write to a stream: a page that stops
// reading (a suspended laptop, a stalled proxy) is dropped after it, its
// goroutine and connection freed. A variable for the tests.
var streamWriteTimeout = 20 * time.Second

// events is the server-sent event stream. Messages:
//
//	event: job    one event of the log (jobEvent), id: the resume point
//	event: mark   the resume point moved (id)
//	event: stats  the counters and sparkline samples (statsMessage), no id
//	event: reload the page is too far behind: reload it
//
// A page's first connect passes ?after=N, the resume point when the page
// was read, so that what committed between the read and the connect comes
// too.
// A page that reconnects sends Last-Event-ID (the browser does) and gets
// every event after it from the event log, then the live ones; it may see
// an event twice and drops repeats by event id.
func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	if _, ok := w.(http.Flusher); !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	var from int64
	resume := false
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("after") // a page's first connect: the resume point it was read at
	}
	if v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "bad Last-Event-ID", http.StatusBadRequest)
			return
		}
		from, resume = n, true
	}
	if h.streams.Add(1) > int64(h.cfg.MaxStreams) {
		h.streams.Add(-1)
		h.log.Warn("live stream refused: Config.MaxStreams streams open", zap.Int("max_streams", h.cfg.MaxStreams))
		w.Header().Set("Retry-After", "10")
		http.Error(w, "too many live streams open", http.StatusServiceUnavailable)
		return
	}
	defer h.streams.Add(-1)
	sub, low, maxSeen, stats := h.hub.subscribe()
	defer h.hub.unsubscribe(sub)
	select {
	case <-sub.gone:
		// The feed is not running (Run ended, or never ran): a 200 that
		// ends at once had every page reconnect each second for ever;
		// a 503 has it try again after 10-15 s (TestStreamWithoutTheFeed).
		w.Header().Set("Retry-After", "10")
		http.Error(w, "the dashboard's live feed is not running", http.StatusServiceUnavailable)
		return
	default:
	}

	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }() // the connection may serve another request
	w.WriteHeader(http.StatusOK)
	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)) // ErrNotSupported: no deadline
		_, err := w.Write(b)
		return err == nil
	}
	flush := func() bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		err := rc.Flush()
		return err == nil
	}
	write([]byte("retry: 1000\n\n"))
	if stats != nil {
		write(appendFrame(nil, "stats", 0, false, stats))
	}
	ctx := r.Context()
	sent := map[int64]bool{} // replayed ids above the hub's resume point
	// send writes a message of the hub, leaving out the job events this
	// stream already has: in one Write when it has none of them.
	send := func(m message) bool {
		pos := 0
		for _, j := range m.jobs {
			if j.evID > from && !sent[j.evID] {
				continue
			}
			if !write(m.frames[pos:j.start]) {
				return false
			}
			pos = j.end
		}
		return pos == len(m.frames) || write(m.frames[pos:])
	}
	if resume && from > maxSeen {
		// A resume point from another process or before a restart: resume
		// from ours, replaying what the feed sent above it
		// (TestFutureLastEventIDGetsEventsAboveTheResumePoint).
		from = low
	}
	switch {
	case resume && from < maxSeen:
		// Replay what the stream may have missed: every event after from,
		// including those above the resume point the hub sent before this
		// stream subscribed.
		after, n := from, 0
		for {
			evs, err := h.client.EventsAfter(ctx, after, queue.MaxJobListLimit)
			if err != nil {
				return
			}
			var frames []byte
			for _, e := range evs {
				frames = appendJobFrame(frames, max(from, min(e.ID, low)), e)
				if e.ID > low {
					sent[e.ID] = true
				}
				after = e.ID
			}
			if !write(frames) {
				return
			}
			n += len(evs)
			if len(evs) < queue.MaxJobListLimit {
				break
			}
			if n >= maxReplay {
				tellReload(write, flush)
				return
			}
		}
		// Read after the replay: an event after from that was pruned
		// before or during it is not in it (TestResumeAcrossPrunedEventsReloads).
		through, err := h.client.EventsPrunedThrough(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// Not known (a role without SELECT on events_pruned): resume
			// as before migration 0025 rather than fail every reconnect.
			h.log.Warn("could not read how far events were pruned; resuming without that check", zap.Error(err))
		case through > from:
			tellReload(write, flush)
			return
		}
		write(appendFrame(nil, "mark", max(from, low), true, []byte("{}")))
	case !resume:
		write(appendFrame(nil, "mark", low, true, []byte("{}")))
	}
	if !flush() {
		return
	}
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sub.gone:
			return // fell behind: the page reconnects and resumes
		case <-keepalive.C:
			if !write([]byte(": keepalive\n\n")) {
				return
			}
		case m := <-sub.ch:
			if !send(m) {
				return
			}
		}
		// Write what is queued before flushing once.
		for more := true; more; {
			select {
			case m := <-sub.ch:
				if !send(m) {
					return
				}
			default:
				more = false
			}
		}
		if !flush() {
			return
		}
	}
}

// tellReload tells a page that the event log cannot bring it up to date
// (too far behind, or events after its resume point were pruned): it
// reloads.
func tellReload(write func([]byte) bool, flush func() bool) {
	write(appendFrame(nil, "reload", 0, false, []byte("{}")))
	flush()
}
