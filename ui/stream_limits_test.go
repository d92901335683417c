package ui

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// smallBuffers accepts connections whose send buffer is small, so that a
// peer that does not read blocks the server's writes after a few
// kilobytes, as a stalled page does after a few megabytes.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// A page that stops reading is dropped after streamWriteTimeout: its
// handler returns instead of blocking in a write for as long as the
// connection lives.
func TestStalledStreamIsDroppedByTheWriteDeadline(t *testing.T) {
	old := streamWriteTimeout
	streamWriteTimeout = 300 * time.Millisecond
	t.Cleanup(func() { streamWriteTimeout = old })

	cfg := Config{}.withDefaults()
	h := &Handler{cfg: cfg, log: cfg.Logger, hub: newHub(cfg)}
	h.hub.ready = true
	returned := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.events(w, r)
		returned <- struct{}{}
	}))
	srv.Listener = smallBuffers{srv.Listener}
	srv.Start()
	defer srv.Close()

	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.(*net.TCPConn).SetReadBuffer(4096))
	_, err = fmt.Fprintf(c, "GET /events HTTP/1.1\r\nHost: %s\r\n\r\n", srv.Listener.Addr())
	require.NoError(t, err)
	// The page reads nothing from here on.

	at := time.Now()
	deadline := time.After(20 * time.Second)
	for id := int64(1); ; {
		select {
		case <-returned:
			require.Equal(t, 0, int(h.streams.Load()), "the stream is no longer counted")
			return
		case <-deadline:
			t.Fatal("the handler of a stream nobody reads still blocks in a write after 20 s")
		case <-time.After(10 * time.Millisecond):
		}
		evs := make([]queue.EventInfo, 100)
		for i := range evs {
			evs[i] = queue.EventInfo{ID: id, JobID: id, Type: queue.EventEnqueued, Queue: "q", Kind: "a-kind-with-a-long-name-to-fill-buffers", At: at}
			id++
		}
		h.hub.deliver(evs, at)
	}
}

// Streams beyond Config.MaxStreams are refused with 503 and a Retry-After;
// a closed stream frees its place.
func TestStreamsCappedByMaxStreams(t *testing.T) {
	cfg := Config{MaxStreams: 2}.withDefaults()
	h := &Handler{cfg: cfg, log: cfg.Logger, hub: newHub(cfg)}
	h.hub.ready = true
	ctx := context.Background()
	var cancels []context.CancelFunc
	done := make(chan struct{}, 3)
	for range 2 {
		sctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		rec := &recorder{hdr: http.Header{}}
		req := httptest.NewRequestWithContext(sctx, http.MethodGet, "/events", nil)
		go func() { h.events(rec, req); done <- struct{}{} }()
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	require.Eventually(t, func() bool { return h.streams.Load() == 2 }, 10*time.Second, 5*time.Millisecond)

	over := httptest.NewRecorder()
	h.events(over, httptest.NewRequestWithContext(ctx, http.MethodGet, "/events", nil))
	require.Equal(t, http.StatusServiceUnavailable, over.Code)
	require.Equal(t, "10", over.Header().Get("Retry-After"))
	require.Equal(t, 2, int(h.streams.Load()), "the refused stream is not counted")

	cancels[0]()
	<-done
	require.Equal(t, 1, int(h.streams.Load()))
	sctx, cancel := context.WithCancel(ctx)
	cancels = append(cancels, cancel)
	rec := &recorder{hdr: http.Header{}}
	go func() {
		h.events(rec, httptest.NewRequestWithContext(sctx, http.MethodGet, "/events", nil))
		done <- struct{}{}
	}()
	require.Eventually(t, func() bool { _, f, _ := rec.counts(); return f > 0 }, 10*time.Second, 5*time.Millisecond,
		"a stream opens once another closed")
}
