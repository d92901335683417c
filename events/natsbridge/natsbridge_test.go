package natsbridge_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/events/natsbridge"
	"github.com/pgwake/pgwake/internal/natstest"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// natsURL is $PGWAKE_TEST_NATS_URL or the local server.
var natsURL = natstest.URL

func randomName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func TestStreamToJetStreamInCommitOrder(t *testing.T) {
	t.Parallel()
	e := eventstest.NewEnv(t)
	ctx := context.Background()
	prefix := "pgwake_test_" + randomName()
	stream := strings.ToUpper(prefix)
	natstest.KeepJetStream(t)
	pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: natsURL(), Stream: stream, Subjects: []string{prefix + ".>"}})
	require.NoError(t, err)
	_, js := jetStream(t, stream)

	cfg := e.Config(pub)
	cfg.Topic = events.TopicPerQueue(prefix) // one subject per queue
	_, stopStream := e.RunStream(cfg)
	c := e.QueueClient(4)
	var jobs []queue.NewJob
	for i := 0; i < 200; i++ {
		q := "default"
		if i%4 == 0 {
			q = "other"
		}
		jobs = append(jobs, queue.NewJob{Kind: "ok", Queue: q})
	}
	jobs = append(jobs, queue.NewJob{Kind: "bad", MaxAttempts: 2})
	_, err = c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	stopQueue := e.RunQueue(c)
	eventstest.WaitFor(t, 60*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 0 })
	stopQueue()
	table := e.TableEvents()
	require.Len(t, table, 201+200+2)

	// Read the JetStream stream from the start, in stream order.
	sub, err := js.SubscribeSync(prefix+".>", nats.OrderedConsumer(), nats.DeliverAll())
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	var got []eventstest.Received
	seen := map[int64]bool{}
	for len(seen) < len(table) {
		msg, err := sub.NextMsg(30 * time.Second)
		require.NoError(t, err, "%d of %d events arrived", len(seen), len(table))
		ev, err := events.Decode(msg.Data)
		require.NoError(t, err)
		require.Equal(t, prefix+"."+events.SubjectSafe(ev.Queue), msg.Subject)
		require.Equal(t, natsbridge.MsgID(msg.Subject, events.MessageUUID(e.Schema, ev.ID)), msg.Header.Get(nats.MsgIdHdr))
		lsn, err := pglogreplParse(msg.Header.Get(events.MetaLSN))
		require.NoError(t, err)
		got = append(got, eventstest.Received{Ev: ev, LSN: lsn})
		seen[ev.ID] = true
	}
	stopStream()
	eventstest.CheckDelivery(t, got, table)
}

// Queue names that cannot form a subject ("a..b", "c.") are mapped by
// TopicPerQueue, so their events reach JetStream instead of failing
// ("no responders") and being retried for ever.
func TestQueueNamesThatAreNoSubjectAreMapped(t *testing.T) {
	t.Parallel()
	e := eventstest.NewEnv(t)
	ctx := context.Background()
	prefix := "pgwake_test_" + randomName()
	stream := strings.ToUpper(prefix)
	natstest.KeepJetStream(t)
	pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: natsURL(), Stream: stream, Subjects: []string{prefix + ".>"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	_, js := jetStream(t, stream)
	cfg := e.Config(pub)
	cfg.Topic = events.TopicPerQueue(prefix)
	_, stopStream := e.RunStream(cfg)
	defer stopStream()
	c := e.QueueClient(1)
	_, err = c.EnqueueMany(ctx, []queue.NewJob{{Kind: "ok", Queue: "a..b"}, {Kind: "ok", Queue: "c."}, {Kind: "ok", Queue: "d.e"}})
	require.NoError(t, err)
	sub, err := js.SubscribeSync(prefix+".>", nats.OrderedConsumer(), nats.DeliverAll())
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	var subjects []string
	for range 3 {
		msg, err := sub.NextMsg(30 * time.Second)
		require.NoError(t, err, "subjects so far %v", subjects)
		subjects = append(subjects, msg.Subject)
	}
	require.Equal(t, []string{prefix + ".a%2E%2Eb", prefix + ".c%2E", prefix + ".d.e"}, subjects)
}

func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	_, err := natsbridge.NewPublisher(natsbridge.Config{URL: "nats://127.0.0.1:1", ConnectTimeout: time.Second})
	require.ErrorIs(t, err, natsbridge.ErrUnreachable)
	require.Contains(t, err.Error(), "nats://127.0.0.1:1")
	// Credentials never show: user and password, a token, in a server list.
	for _, u := range []string{"nats://app:s3cretPW@127.0.0.1:1", "nats://t0kenSECRET@127.0.0.1:1",
		"nats://127.0.0.1:2,nats://app:s3cretPW@127.0.0.1:1"} {
		_, err := natsbridge.NewPublisher(natsbridge.Config{URL: u, ConnectTimeout: time.Second})
		require.ErrorIs(t, err, natsbridge.ErrUnreachable)
		require.NotContains(t, err.Error(), "s3cretPW")
		require.NotContains(t, err.Error(), "t0kenSECRET")
		require.Contains(t, err.Error(), "127.0.0.1:1")
	}
}

func pglogreplParse(s string) (uint64, error) {
	lsn, err := pglogrepl.ParseLSN(s)
	return uint64(lsn), err
}

// Both publishers write the same wire format, in order, with Nats-Msg-Id
// deduplication: a re-published message is stored once.
func TestPublishersOrderAndDeduplicate(t *testing.T) {
	t.Parallel()
	for _, sync := range []bool{false, true} {
		prefix := "pgwake_test_" + randomName()
		stream := strings.ToUpper(prefix)
		natstest.KeepJetStream(t)
		pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: natsURL(), Stream: stream, Subjects: []string{prefix}, SyncPublish: sync})
		require.NoError(t, err)
		nc, err := nats.Connect(natsURL())
		require.NoError(t, err)
		js, err := nc.JetStream()
		require.NoError(t, err)
		var msgs []*message.Message
		for i := int64(1); i <= 50; i++ {
			m, err := events.NewMessage("s", events.Event{ID: i, JobID: i, Type: events.TypeEnqueued, At: time.Now()}, pglogrepl.LSN(i))
			require.NoError(t, err)
			msgs = append(msgs, m)
		}
		require.NoError(t, pub.Publish(prefix, msgs...))
		require.NoError(t, pub.Publish(prefix, msgs[40:]...)) // a retry
		info, err := js.StreamInfo(stream)
		require.NoError(t, err)
		require.Equal(t, uint64(50), info.State.Msgs, "sync=%v", sync)
		sub, err := js.SubscribeSync(prefix, nats.OrderedConsumer(), nats.DeliverAll())
		require.NoError(t, err)
		for i := int64(1); i <= 50; i++ {
			msg, err := sub.NextMsg(30 * time.Second)
			require.NoError(t, err)
			ev, err := events.Decode(msg.Data)
			require.NoError(t, err)
			require.Equal(t, i, ev.ID, "sync=%v", sync)
			require.Equal(t, strconv.FormatInt(i, 10), msg.Header.Get(events.MetaEventID))
			// watermill-nats's format: its marshaler reads the message back.
			wm, err := (&wmnats.NATSMarshaler{}).Unmarshal(msg)
			require.NoError(t, err)
			sent := msgs[i-1]
			require.Equal(t, sent.UUID, wm.UUID, "sync=%v", sync)
			require.Equal(t, sent.Metadata, wm.Metadata, "sync=%v", sync)
			require.Equal(t, []byte(sent.Payload), []byte(wm.Payload))
			require.Equal(t, natsbridge.MsgID(prefix, sent.UUID), msg.Header.Get(nats.MsgIdHdr))
		}
		_ = sub.Unsubscribe()
		_ = js.DeleteStream(stream)
		nc.Close()
		require.NoError(t, pub.Close())
	}
}

// EnsureStream on a stream that exists but does not capture the subjects
// asked for (one made earlier for another topic) adds the missing ones, so
// publishing to them is stored instead of failing with "no responders"; a
// subject a wildcard already captures is not added again.
func TestEnsureStreamAddsMissingSubjects(t *testing.T) {
	t.Parallel()
	natstest.KeepJetStream(t)
	prefix := "pgwake_test_" + randomName()
	stream := strings.ToUpper(prefix)
	nc, js := jetStream(t, stream)
	_, err := js.AddStream(&nats.StreamConfig{Name: stream, Subjects: []string{prefix + ".events"}})
	require.NoError(t, err)

	require.NoError(t, natsbridge.EnsureStream(nc, stream, []string{prefix + ".orders", prefix + ".orders._dead_letter"}))
	info, err := js.StreamInfo(stream)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{prefix + ".events", prefix + ".orders", prefix + ".orders._dead_letter"}, info.Config.Subjects)
	_, err = js.Publish(prefix+".orders", []byte("x"))
	require.NoError(t, err, "stored in the stream")

	_, err = js.UpdateStream(&nats.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}})
	require.NoError(t, err)
	require.NoError(t, natsbridge.EnsureStream(nc, stream, []string{prefix + ".a.b", prefix + ".c"}))
	info, err = js.StreamInfo(stream)
	require.NoError(t, err)
	require.Equal(t, []string{prefix + ".>"}, info.Config.Subjects, "captured by the wildcard already")
}

// jetStream connects to the test NATS server and deletes stream when the
// test ends.
func jetStream(t *testing.T, stream string) (*nats.Conn, nats.JetStreamContext) {
	t.Helper()
	nc, err := nats.Connect(natsURL())
	require.NoError(t, err)
	js, err := nc.JetStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = js.DeleteStream(stream)
		nc.Close()
	})
	return nc, js
}
