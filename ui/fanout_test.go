package ui

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// recorder is a stream's http.ResponseWriter that counts its writes and
// flushes.
type recorder struct {
	mu      sync.Mutex
	hdr     http.Header
	body    bytes.Buffer
	writes  int
	flushes int
}

func (r *recorder) Header() http.Header { return r.hdr }
func (r *recorder) WriteHeader(int)     {}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes++
	return r.body.Write(b)
}

func (r *recorder) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.flushes++
}

func (r *recorder) counts() (writes, flushes int, body string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes, r.flushes, r.body.String()
}

// openFanout opens n streams on a hub that is not reading any database
// (its deliver is called by the test) and returns their recorders.
func openFanout(t *testing.T, n int) (*hub, []*recorder) {
	t.Helper()
	cfg := Config{}.withDefaults()
	h := &Handler{cfg: cfg, log: cfg.Logger, hub: newHub(cfg)}
	h.hub.ready = true
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	var recs []*recorder
	for range n {
		rec := &recorder{hdr: http.Header{}}
		recs = append(recs, rec)
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/events", nil)
		wg.Go(func() { h.events(rec, req) })
	}
	pgtest.WaitFor(t, 10*time.Second, "the streams open", func() bool {
		for _, r := range recs {
			if _, f, _ := r.counts(); f == 0 {
				return false
			}
		}
		return true
	})
	return h.hub, recs
}

// A read of the event log reaches each stream as one Write and one Flush,
// whatever the number of events it found, and every stream gets the same
// bytes (each event encoded once, not once per stream).
func TestBatchReachesAStreamInOneWrite(t *testing.T) {
	h, recs := openFanout(t, 10)
	was := streamCounts(recs)
	at := time.Now()
	var evs []queue.EventInfo
	for i := range int64(50) {
		evs = append(evs, queue.EventInfo{ID: i + 1, JobID: i/2 + 1, Type: queue.EventEnqueued, Queue: "q", Kind: "k", At: at})
	}
	require.Equal(t, 50, h.deliver(evs, at))
	pgtest.WaitFor(t, 10*time.Second, "the batch on every stream, flushed", func() bool {
		for i, r := range recs {
			// The flush follows the write: wait for both.
			if _, f, b := r.counts(); !bytes.Contains([]byte(b), []byte("id: 50\nevent: mark\n")) || f == was[i].flushes {
				return false
			}
		}
		return true
	})
	var first string
	for i, r := range recs {
		w, f, b := r.counts()
		require.Equal(t, 1, w-was[i].writes, "stream %d: one write for the batch", i)
		require.Equal(t, 1, f-was[i].flushes, "stream %d: one flush for the batch", i)
		got := b[was[i].size:]
		require.Equal(t, 50, bytes.Count([]byte(got), []byte("event: job\n")))
		if i == 0 {
			first = got
		}
		require.Equal(t, first, got, "every stream writes the same bytes")
	}
}

// The sparkline's latency is the median of its second's jobs, taken when
// the counters are sent.
func TestSampleLatencyMedian(t *testing.T) {
	h := newHub(Config{}.withDefaults())
	sec := time.Unix(time.Now().Unix(), 0)
	for i, ms := range []int{30, 10, 20, 50, 40} {
		id := int64(i + 1)
		h.sample(queue.EventInfo{JobID: id, Type: queue.EventEnqueued, At: sec})
		h.sample(queue.EventInfo{JobID: id, Type: queue.EventSucceeded, At: sec.Add(time.Duration(ms) * time.Millisecond)})
	}
	h.medians()
	require.Len(t, h.samples, 1)
	require.Equal(t, 5, h.samples[0].Succeeded)
	require.Equal(t, 30.0, h.samples[0].LatencyMS)
	h.sample(queue.EventInfo{JobID: 9, Type: queue.EventEnqueued, At: sec})
	h.sample(queue.EventInfo{JobID: 9, Type: queue.EventSucceeded, At: sec.Add(900 * time.Millisecond)})
	h.medians()
	require.Equal(t, 40.0, h.samples[0].LatencyMS, "the median of the six, taken again")
}

// BenchmarkFanout is the dashboard's side of one read of the event log
// that found 15 events (about what a read finds at 200 jobs/s: 3 events a
// job, a read per 25 ms), served to 10 streams over HTTP and read by 10
// clients that split it into events as EventSource does, without a
// database. It waits for every client to have the batch before the next
// one and reports the process's CPU time (user and system, from getrusage:
// not the wall clock, which the machine's load stretches) per batch.
//
//	go test -run '^$' -bench BenchmarkFanout -benchtime 2000x ./ui/
func BenchmarkFanout(b *testing.B) {
	cfg := Config{}.withDefaults()
	h := &Handler{cfg: cfg, log: cfg.Logger, hub: newHub(cfg)}
	h.hub.ready = true
	srv := httptest.NewServer(http.HandlerFunc(h.events))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const streams, perRead = 10, 15
	marks := make(chan string, streams)
	for range streams {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		require.NoError(b, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(b, err)
		go readMarks(resp, marks)
	}
	for range streams {
		<-marks // the first mark: the stream is open
	}
	at := time.Now()
	var id int64
	batch := func() {
		evs := make([]queue.EventInfo, perRead)
		for i := range evs {
			id++
			evs[i] = queue.EventInfo{ID: id, JobID: id/3 + 1, Type: queue.EventEnqueued, Queue: "load", Kind: "k", At: at}
		}
		h.hub.deliver(evs, at)
		for range streams {
			<-marks
		}
	}
	batch() // warm-up
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		batch()
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/batch")
}

// readMarks reads a stream's events line by line, as EventSource does,
// and sends the id of each mark event to marks.
func readMarks(resp *http.Response, marks chan<- string) {
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var event, id string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if event == "mark" {
				marks <- id
			}
			event = ""
		case strings.HasPrefix(line, "event: "):
			event = line[7:]
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		}
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A stream that does not keep up (its writes block) is dropped once
// streamBacklog messages (reads of the log, not events) wait for it; the
// other streams are kept and get every event.
func TestSlowStreamIsDropped(t *testing.T) {
	h, recs := openFanout(t, 2)
	slow := recs[0]
	slow.mu.Lock() // its next Write blocks until the test ends
	unblocked := false
	defer func() {
		if !unblocked {
			slow.mu.Unlock()
		}
	}()
	at := time.Now()
	for i := range int64(streamBacklog + 2) {
		h.deliver([]queue.EventInfo{{ID: i + 1, JobID: i + 1, Type: queue.EventEnqueued, Queue: "q", Kind: "k", At: at}}, at)
		if i == 0 {
			time.Sleep(10 * time.Millisecond) // the slow stream takes the first and blocks on it
		}
	}
	h.mu.Lock()
	n := len(h.subs)
	h.mu.Unlock()
	require.Equal(t, 1, n, "the slow stream was dropped, the other kept")
	unblocked = true
	slow.mu.Unlock()
	pgtest.WaitFor(t, 10*time.Second, "the fast stream has every event", func() bool {
		_, _, b := recs[1].counts()
		return bytes.Contains([]byte(b), []byte("id: "+strconv.Itoa(streamBacklog+2)+"\nevent: mark\n"))
	})
}

// Counters due with a read of the event log go in the same message: one
// Write and one Flush per stream for the events and the counters.
func TestCountersRideWithAReadInOneWrite(t *testing.T) {
	h, recs := openFanout(t, 3)
	was := streamCounts(recs)
	at := time.Now()
	evs := []queue.EventInfo{{ID: 1, JobID: 1, Type: queue.EventEnqueued, Queue: "q", Kind: "k", At: at}}
	require.Equal(t, 1, h.publish(evs, at, []queue.QueueStat{{Queue: "q", Pending: 7}}, true))
	pgtest.WaitFor(t, 10*time.Second, "the message on every stream", func() bool {
		for i, r := range recs {
			if _, _, b := r.counts(); !bytes.Contains([]byte(b[was[i].size:]), []byte("event: stats\n")) {
				return false
			}
		}
		return true
	})
	for i, r := range recs {
		w, f, b := r.counts()
		got := b[was[i].size:]
		require.Equal(t, 1, w-was[i].writes, "stream %d: one write for events and counters", i)
		require.Equal(t, 1, f-was[i].flushes, "stream %d: one flush", i)
		require.Contains(t, got, "event: job\n")
		require.Contains(t, got, `"pending":7`)
	}
}

// streamCount is what a stream had written when streamCounts took it.
type streamCount struct{ writes, flushes, size int }

// streamCounts takes each stream's writes, flushes and bytes so far.
func streamCounts(recs []*recorder) []streamCount {
	var was []streamCount
	for _, r := range recs {
		w, f, b := r.counts()
		was = append(was, streamCount{w, f, len(b)})
	}
	return was
}
