// Package natsbridge publishes pgwake events to NATS JetStream: a Watermill
// message.Publisher for events.Config.Publisher that returns only when
// JetStream acknowledged every message of the call (so the stream
// acknowledges a WAL position only once the broker stored the events) and
// sets Nats-Msg-Id to the subject and the message UUID (MsgID), which is
// derived from the event id: JetStream drops a re-published event within
// its duplicate window. A message over the server's max_payload fails with
// an error wrapping events.ErrMessageTooLarge, and the stream skips it.
//
// Messages are in watermill-nats's wire format (its NATSMarshaler: payload
// as data, metadata as headers), so watermill-nats subscribers read them. By
// default a Publish call sends its messages asynchronously, in order on one
// connection, and then waits for all acknowledgements; SyncPublish sends
// one message at a time instead (one round trip per message).
package natsbridge

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/pgwake/pgwake/events"
)

// Config configures NewPublisher. URL is required.
type Config struct {
	// URL of the NATS server, e.g. nats://127.0.0.1:4222.
	URL string
	// Stream is the JetStream stream that stores the events; it is created
	// with Subjects if it does not exist. Default "PGWAKE_EVENTS".
	Stream string
	// Subjects the stream captures. They must cover every topic the
	// events.Config.Topic function returns. Default ["pgwake.events",
	// "pgwake.events.>"] (events.SingleTopic, TopicPerType and TopicPerQueue
	// with the default prefix).
	Subjects []string
	// ConnectTimeout bounds the first connection. Default 5s.
	ConnectTimeout time.Duration
	// AckTimeout bounds the wait for JetStream's acknowledgements of one
	// Publish call. Default 30s.
	AckTimeout time.Duration
	// SyncPublish publishes one message at a time, waiting for each
	// message's acknowledgement before sending the next. Default false.
	SyncPublish bool
	// Logger is unused (it got watermill-nats's logs when SyncPublish used
	// its publisher). Default none.
	Logger watermill.LoggerAdapter
}

// ErrUnreachable is returned when the NATS server cannot be reached.
var ErrUnreachable = errors.New("natsbridge: NATS server unreachable")

// ErrNoJetStream is returned when the server does not have JetStream on.
var ErrNoJetStream = errors.New("natsbridge: JetStream is not available")

// NewPublisher connects to NATS, makes sure the stream exists and returns a
// publisher. Close it to close the connection.
func NewPublisher(cfg Config) (message.Publisher, error) {
	if cfg.URL == "" {
		return nil, errors.New("natsbridge: URL is empty")
	}
	if cfg.Stream == "" {
		cfg.Stream = "PGWAKE_EVENTS"
	}
	if len(cfg.Subjects) == 0 {
		cfg.Subjects = []string{"pgwake.events", "pgwake.events.>"}
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 30 * time.Second
	}
	nc, err := nats.Connect(cfg.URL, nats.Timeout(cfg.ConnectTimeout), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v; is nats-server running (with -js)?", ErrUnreachable, RedactURL(cfg.URL), err)
	}
	if err := EnsureStream(nc, cfg.Stream, cfg.Subjects); err != nil {
		nc.Close()
		return nil, err
	}
	jsOpt := nats.PublishAsyncMaxPending(4096)
	if cfg.SyncPublish {
		jsOpt = nats.MaxWait(cfg.AckTimeout)
	}
	js, err := nc.JetStream(jsOpt)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: %v", ErrNoJetStream, err)
	}
	t := target{nc, cfg.Stream, cfg.Subjects}
	if cfg.SyncPublish {
		return &syncPublisher{target: t, js: js}, nil
	}
	return &asyncPublisher{target: t, js: js, timeout: cfg.AckTimeout, stall: nats.StallWait(cfg.AckTimeout)}, nil
}

// EnsureStream creates the JetStream stream with subjects unless a stream of
// that name exists; an existing one that does not capture every subject
// (exactly or through a wildcard) gets the missing ones added, or the
// error says why it could not (a stream made earlier for other topics:
// every Publish to them would fail with "no responders";
// TestEnsureStreamAddsMissingSubjects).
func EnsureStream(nc *nats.Conn, stream string, subjects []string) error {
	js, err := nc.JetStream()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoJetStream, err)
	}
	if info, err := js.StreamInfo(stream); err == nil {
		var missing []string
		for _, subj := range subjects {
			if !slices.ContainsFunc(info.Config.Subjects, func(p string) bool { return subjectMatches(p, subj) }) {
				missing = append(missing, subj)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		cfg := info.Config
		cfg.Subjects = append(slices.Clone(cfg.Subjects), missing...)
		if _, err := js.UpdateStream(&cfg); err != nil {
			return fmt.Errorf("natsbridge: stream %s captures %v, not %v, and adding them failed: %w", stream, info.Config.Subjects, missing, err)
		}
		return nil
	} else if errors.Is(err, nats.ErrJetStreamNotEnabled) || errors.Is(err, nats.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrNoResponders) {
		// No responders: nothing answers the JetStream API, which is how
		// nats.go reports a server without JetStream
		// (TestServerWithoutJetStream).
		return fmt.Errorf("%w on %s (%v): start nats-server with -js, or enable JetStream for the account", ErrNoJetStream, nc.ConnectedUrlRedacted(), err)
	} else if !errors.Is(err, nats.ErrStreamNotFound) {
		return fmt.Errorf("natsbridge: stream %s: %w", stream, err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: stream, Subjects: subjects}); err != nil {
		return fmt.Errorf("natsbridge: creating stream %s for %v: %w", stream, subjects, err)
	}
	return nil
}

// subjectMatches reports whether NATS subject pattern p (tokens split by
// '.', '*' one token, '>' one or more trailing tokens) matches subj.
func subjectMatches(p, subj string) bool {
	pt, st := strings.Split(p, "."), strings.Split(subj, ".")
	for i, tok := range pt {
		switch {
		case tok == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case tok != "*" && tok != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
}

// asyncPublisher sends a Publish call's messages without waiting, then
// waits for every acknowledgement.
type asyncPublisher struct {
	target
	js      nats.JetStreamContext
	timeout time.Duration
	stall   nats.PubOpt // StallWait(timeout)
}

// Publish sends msgs to subject topic in order and returns once JetStream
// stored all of them (or with the first error; then some may be stored,
// which a retry with the same UUIDs does not duplicate within the stream's
// duplicate window).
func (p *asyncPublisher) Publish(topic string, msgs ...*message.Message) error {
	wait, err := p.PublishAsync(topic, msgs...)
	if err != nil {
		return err
	}
	return wait(context.Background())
}

// PublishAsync sends msgs to subject topic in order without waiting; wait
// returns once JetStream acknowledged every one of them, or with the first
// error, after AckTimeout or when ctx is done. It implements
// events.AsyncPublisher, so the stream keeps several batches on the wire.
func (p *asyncPublisher) PublishAsync(topic string, msgs ...*message.Message) (wait func(ctx context.Context) error, err error) {
	futures := make([]nats.PubAckFuture, 0, len(msgs))
	for _, m := range msgs {
		// Past the pending limit, wait for room as long as for an ack.
		f, err := p.js.PublishMsgAsync(natsMsg(topic, m), p.stall)
		if err != nil {
			return nil, p.fail(topic, err)
		}
		futures = append(futures, f)
	}
	sent := time.Now()
	return func(ctx context.Context) error {
		timeout := time.NewTimer(p.timeout - time.Since(sent))
		defer timeout.Stop()
		for _, f := range futures {
			select {
			case <-ctx.Done():
				return fmt.Errorf("natsbridge: publishing to %s: %w", topic, ctx.Err())
			case <-f.Ok():
			case err := <-f.Err():
				return p.fail(topic, err)
			case <-timeout.C:
				return fmt.Errorf("natsbridge: publishing to %s: no acknowledgement from JetStream within %s", topic, p.timeout)
			}
		}
		return nil
	}, nil
}

// natsMsg is m in the format of watermill-nats's NATSMarshaler (payload
// as data, metadata as headers, the UUID in its _watermill_message_uuid
// header) with Nats-Msg-Id set to MsgID(topic, UUID), as the nats.MsgId option would
// set it: one header map sized for all of them, the values in one array
// (the marshaler and the option grew the map past 8 keys for every
// message). TestPublishersOrderAndDeduplicate reads it back with the
// marshaler.
func natsMsg(topic string, m *message.Message) *nats.Msg {
	n := len(m.Metadata) + 2
	h := make(nats.Header, n)
	vals := make([]string, 0, n)
	vals = append(vals, m.UUID)
	h[wmnats.WatermillUUIDHdr] = vals[0:1:1]
	for k, v := range m.Metadata {
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	vals = append(vals, MsgID(topic, m.UUID))
	h[nats.MsgIdHdr] = vals[len(vals)-1 : len(vals) : len(vals)]
	return &nats.Msg{Subject: topic, Data: m.Payload, Header: h}
}

// MsgID is the Nats-Msg-Id of a message with uuid published to subject:
// "<subject>:<uuid>". JetStream's duplicate window is per stream, not per
// subject, and a message UUID names a schema and an event id only: two
// databases with pgwake in schemas of the same name, forwarding to their
// own topics in one stream (the CLI's default PGWAKE_EVENTS), have events
// of equal UUIDs, and with the UUID alone JetStream dropped the second as a
// duplicate of the first (TestSameEventIDOnTwoSubjectsOfOneStreamIsStoredTwice).
// A re-published event has the same topic, so the same MsgID.
func MsgID(subject, uuid string) string { return subject + ":" + uuid }

// target is the connection and the stream a publisher stores in.
type target struct {
	nc       *nats.Conn
	stream   string
	subjects []string
}

// fail wraps err of publishing to topic. A message over the server's
// max_payload wraps events.ErrMessageTooLarge. "No responders" means no
// stream captures the subject: the stream was deleted (or its subjects
// changed) under the publisher, so it is made again and the next attempt
// is stored (TestStreamDeletedUnderTheForwarder; before, every retry failed
// the same way until the forwarder was restarted).
func (t target) fail(topic string, err error) error {
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("natsbridge: publishing to %s: %w (%w)", topic, events.ErrMessageTooLarge, err)
	case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrNoStreamResponse): // sync, async
		if eerr := EnsureStream(t.nc, t.stream, t.subjects); eerr != nil {
			return fmt.Errorf("natsbridge: publishing to %s: %w: no JetStream stream captures it, and making stream %s failed: %w", topic, err, t.stream, eerr)
		}
		return fmt.Errorf("natsbridge: publishing to %s: %w: no JetStream stream captured it; stream %s made again for %v", topic, err, t.stream, t.subjects)
	}
	return fmt.Errorf("natsbridge: publishing to %s: %w", topic, err)
}

// syncPublisher publishes one message at a time, each awaiting
// JetStream's acknowledgement.
type syncPublisher struct {
	target
	js nats.JetStreamContext
}

// Publish sends msgs to subject topic in order, each acknowledged before
// the next is sent.
func (p *syncPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if _, err := p.js.PublishMsg(natsMsg(topic, m)); err != nil {
			return p.fail(topic, err)
		}
	}
	return nil
}

// Close closes the connection (both publishers).
func (t target) Close() error {
	t.nc.Close()
	return nil
}

// RedactURL hides the credentials of each URL of a NATS server list (comma
// separated): user and password, or a token (which NATS takes as the user
// part). An unparsable URL is replaced whole.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil:
			parts[i] = "(unparsable URL)"
		case u.User != nil:
			u.User = url.User("xxxxx")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
