package natsbridge_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/events/natsbridge"
	"github.com/pgwake/pgwake/internal/natstest"
	"github.com/pgwake/pgwake/queue"
)

// Two forwarders of two databases, both with pgwake in schema "pgwake"
// (the default) and their own topics, share the CLI's default JetStream
// stream PGWAKE_EVENTS (the second's EnsureStream adds its subjects to
// it). JetStream's duplicate window is per stream, so the second
// database's event 1 must not be dropped as a duplicate of the first's
// event 1 on another subject: before, it was acknowledged (as a
// duplicate) and never stored.
func TestSameEventIDOnTwoSubjectsOfOneStreamIsStoredTwice(t *testing.T) {
	t.Parallel()
	natstest.KeepJetStream(t)
	for _, sync := range []bool{false, true} {
		prefix := "pgwake_test_" + randomName()
		stream := strings.ToUpper(prefix)
		_, js := jetStream(t, stream)
		pubA, err := natsbridge.NewPublisher(natsbridge.Config{URL: natsURL(), Stream: stream, Subjects: []string{prefix + ".a"}, SyncPublish: sync})
		require.NoError(t, err)
		pubB, err := natsbridge.NewPublisher(natsbridge.Config{URL: natsURL(), Stream: stream, Subjects: []string{prefix + ".b"}, SyncPublish: sync})
		require.NoError(t, err)
		for i, pub := range []message.Publisher{pubA, pubB} {
			m, err := events.NewMessage("pgwake", events.Event{ID: 1, JobID: 1, Type: events.TypeEnqueued, Queue: fmt.Sprint(i), At: time.Now()}, pglogrepl.LSN(1))
			require.NoError(t, err)
			require.NoError(t, pub.Publish(prefix+"."+string(rune('a'+i)), m))
		}
		info, err := js.StreamInfo(stream)
		require.NoError(t, err)
		require.Equal(t, uint64(2), info.State.Msgs, "sync=%v: both databases' event 1 stored", sync)
		require.NoError(t, pubA.Close())
		require.NoError(t, pubB.Close())
	}
}

// ownServer starts a nats-server with JetStream (file storage) and the
// given extra config lines on a free port; it is killed when the test ends.
func ownServer(t *testing.T, extra string) (url string, restart func()) {
	t.Helper()
	bin := "/usr/sbin/nats-server"
	if _, err := os.Stat(bin); err != nil {
		t.Skip("no nats-server binary")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	js := fmt.Sprintf("jetstream { store_dir: %q }", filepath.Join(dir, "js"))
	if extra == "no jetstream" {
		js, extra = "", ""
	}
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf("listen: 127.0.0.1:%d\n%s\n%s\n", port, js, extra)), 0o600))
	var cmd *exec.Cmd
	start := func() {
		cmd = exec.Command(bin, "-c", conf)
		require.NoError(t, cmd.Start())
		url = fmt.Sprintf("nats://127.0.0.1:%d", port)
		eventstest.WaitFor(t, 10*time.Second, "nats-server up", func() bool {
			nc, err := nats.Connect(url)
			if err != nil {
				return false
			}
			nc.Close()
			return true
		})
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	start()
	t.Cleanup(stop)
	return url, func() { stop(); start() }
}

// An event larger than the server's max_payload (an error of 100 kB
// against 16 kB; the app role may insert such a row, and
// queue.Config.MaxErrorBytes has no upper bound against NATS's default 1
// MB) cannot be published, not even to the dead-letter topic: it must not
// hold the stream for ever. The events around it are delivered in the same
// session, and it is reported with its id.
func TestEventLargerThanMaxPayload(t *testing.T) {
	t.Parallel()
	url, _ := ownServer(t, "max_payload: 16384")
	e := eventstest.NewEnv(t)
	ctx := context.Background()
	prefix := "pgwake_test_" + randomName()
	pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: url, Stream: "BIG", Subjects: []string{prefix, prefix + ".>"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	core, logs := observer.New(zap.WarnLevel)
	reg := prometheus.NewRegistry()
	cfg := e.Config(pub)
	cfg.Topic = events.SingleTopic(prefix)
	cfg.Logger, cfg.Registerer = zap.New(core), reg
	cfg.MinBackoff, cfg.MaxBackoff, cfg.PublishAttempts, cfg.DeadLetterTopic = 10*time.Millisecond, 100*time.Millisecond, 2, prefix+"._dead_letter"
	s, _ := e.RunStream(cfg)

	c := e.QueueClient(1)
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)
	var bigID int64
	require.NoError(t, e.Pool.QueryRow(ctx, `INSERT INTO `+e.Table("events")+` (job_id, type, queue, kind, attempt, data)
		VALUES (1, 'failed', 'default', 'ok', 1, jsonb_build_object('error', repeat('x', 100000))) RETURNING id`).Scan(&bigID))
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)

	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := nc.JetStream()
	require.NoError(t, err)
	eventstest.WaitFor(t, 30*time.Second, "both small events stored", func() bool {
		info, err := js.StreamInfo("BIG")
		return err == nil && info.State.Msgs >= 2
	})
	require.Equal(t, int64(1), s.Sessions(), "no reconnect")
	skipped := logs.FilterMessageSnippet("event skipped").All()
	require.Len(t, skipped, 1)
	require.Equal(t, bigID, skipped[0].ContextMap()["event_id"])
	require.Equal(t, float64(1), testutil.ToFloat64(mustCounter(t, reg, "pgwake_events_skipped_total", "too_large")))
}

func mustCounter(t *testing.T, reg *prometheus.Registry, name, reason string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
					c.Add(m.GetCounter().GetValue())
					return c
				}
			}
		}
	}
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
}

// A NATS server without JetStream: NewPublisher fails with ErrNoJetStream
// saying to start the server with -js (before: "natsbridge: stream
// PGWAKE_EVENTS: nats: no responders available for request", which
// nats.go returns for a JetStream API request nobody answers).
func TestServerWithoutJetStream(t *testing.T) {
	t.Parallel()
	url, _ := ownServer(t, "no jetstream")
	for _, sync := range []bool{false, true} {
		_, err := natsbridge.NewPublisher(natsbridge.Config{URL: url, SyncPublish: sync})
		require.ErrorIs(t, err, natsbridge.ErrNoJetStream)
		require.Contains(t, err.Error(), "-js")
	}
}

// The JetStream stream is deleted under a running forwarder (an operator,
// a reset): publishing fails with "no responders". The bridge makes the
// stream again, so the events wait a retry, not a restart of the
// forwarder: before, it retried for ever with "nats: no responders
// available for request".
func TestStreamDeletedUnderTheForwarder(t *testing.T) {
	t.Parallel()
	url, _ := ownServer(t, "")
	prefix := "pgwake_test_" + randomName()
	for _, sync := range []bool{false, true} {
		pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: url, Stream: "GONE", Subjects: []string{prefix, prefix + ".>"}, SyncPublish: sync, AckTimeout: 2 * time.Second})
		require.NoError(t, err)
		nc, err := nats.Connect(url)
		require.NoError(t, err)
		js, err := nc.JetStream()
		require.NoError(t, err)
		require.NoError(t, js.DeleteStream("GONE"))
		m, err := events.NewMessage("pgwake", events.Event{ID: 1, JobID: 1, Type: events.TypeEnqueued, At: time.Now()}, pglogrepl.LSN(1))
		require.NoError(t, err)
		err = pub.Publish(prefix, m)
		if err != nil {
			require.Contains(t, err.Error(), "GONE", "the error names the stream")
			require.NoError(t, pub.Publish(prefix, m), "sync=%v: the retry is stored", sync)
		}
		info, err := js.StreamInfo("GONE")
		require.NoError(t, err, "sync=%v", sync)
		require.Equal(t, uint64(1), info.State.Msgs)
		nc.Close()
		require.NoError(t, pub.Close())
	}
}
