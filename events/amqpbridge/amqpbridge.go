// Package amqpbridge publishes pgwake events to RabbitMQ (AMQP 0.9.1): a
// Watermill message.Publisher for events.Config.Publisher with publisher
// confirms on, so the stream acknowledges a WAL position only once the
// broker took the events. Messages are mandatory: one that no queue bound
// to its exchange takes is returned, and the publish fails with ErrNoQueue
// (RabbitMQ drops it otherwise, yet confirms it). By default it sends a call's messages on one
// confirm-mode channel without waiting and awaits their confirms
// afterwards (events.AsyncPublisher: several batches on the wire);
// SyncPublish sends one message at a time (a confirm round trip per
// message). Messages are in watermill-amqp's wire format
// (DefaultMarshaler), so its subscribers read them.
//
// Topology: each topic is a durable fanout exchange of that name; messages
// are persistent. Bind your queues to it (watermill-amqp's durable pub/sub
// subscriber does that for you).
package amqpbridge

import (
	"errors"
	"net/url"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Config configures NewPublisher. URL is required.
type Config struct {
	// URL of the broker, e.g. amqp://guest:guest@127.0.0.1:5672/.
	URL string
	// ConfirmTimeout bounds the wait for the confirms of one Publish call.
	// Default 30s.
	ConfirmTimeout time.Duration
	// SyncPublish publishes one message at a time, waiting for each
	// message's confirm before sending the next. Default false.
	SyncPublish bool
	// Logger is unused (it got watermill-amqp's logs when SyncPublish used
	// its publisher). Default none.
	Logger watermill.LoggerAdapter
}

// ErrNoQueue is wrapped by a publish error when the broker returned a
// message because no queue is bound to the topic's exchange: RabbitMQ
// confirms and drops such a message unless it is mandatory, and the
// events were lost. The stream retries it (holding the slot) until a queue
// is bound, or dead-letters it to a topic that has one.
var ErrNoQueue = errors.New("no queue is bound to the exchange: the broker returned the message")

// ErrUnreachable is returned when the broker cannot be reached.
var ErrUnreachable = errors.New("amqpbridge: AMQP broker unreachable")

// PubSubConfig is the watermill-amqp configuration the publisher uses:
// durable fanout exchange per topic, persistent messages, confirmed
// publishes on one pooled channel (which keeps their order). Subscribers
// can start from it too (set Queue.GenerateName).
func PubSubConfig(url string) wmamqp.Config {
	c := wmamqp.NewDurablePubSubConfig(url, nil)
	c.Publish.ConfirmDelivery = true
	c.Publish.ChannelPoolSize = 1
	return c
}

// NewPublisher connects to the broker and returns a publisher. Close it to
// close the connection.
func NewPublisher(cfg Config) (message.Publisher, error) {
	if cfg.URL == "" {
		return nil, errors.New("amqpbridge: URL is empty")
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	if cfg.ConfirmTimeout == 0 {
		cfg.ConfirmTimeout = 30 * time.Second
	}
	p, err := newAsyncPublisher(cfg.URL, cfg.ConfirmTimeout)
	switch {
	case err != nil:
		return nil, err
	case cfg.SyncPublish:
		return syncPublisher{p}, nil
	}
	return p, nil
}

// redact hides the password of an AMQP URL.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}
