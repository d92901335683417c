package amqpbridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// asyncPublisher publishes on one confirm-mode channel without waiting per
// message: a call sends its messages in order and hands back a wait for
// their confirms, so several calls can be on the wire at once. The
// connection is opened again on the next call after it failed.
type asyncPublisher struct {
	url     string
	cfg     wmamqp.Config
	timeout time.Duration
	m       wmamqp.DefaultMarshaler

	mu       sync.Mutex // one sender at a time: keeps the order; guards the rest
	conn     *amqp.Connection
	ch       *amqp.Channel
	declared map[string]bool // exchanges declared on ch
	closed   bool
}

func newAsyncPublisher(url string, timeout time.Duration) (*asyncPublisher, error) {
	p := &asyncPublisher{url: url, cfg: PubSubConfig(url), timeout: timeout}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.channel(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v; is RabbitMQ running and are the credentials right?", ErrUnreachable, redact(url), err)
	}
	return p, nil
}

// channel returns the open confirm-mode channel, connecting first if
// needed. p.mu is held.
func (p *asyncPublisher) channel() (*amqp.Channel, error) {
	if p.closed {
		return nil, errors.New("amqpbridge: publisher closed")
	}
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	p.reset()
	conn, err := amqp.Dial(p.url)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	p.conn, p.ch, p.declared = conn, ch, map[string]bool{}
	return ch, nil
}

// reset drops the connection. p.mu is held.
func (p *asyncPublisher) reset() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.ch = nil, nil
}

// Publish sends msgs to the exchange topic and returns once the broker
// confirmed every one of them.
func (p *asyncPublisher) Publish(topic string, msgs ...*message.Message) error {
	wait, err := p.PublishAsync(topic, msgs...)
	if err != nil {
		return err
	}
	return wait(context.Background())
}

// PublishAsync sends msgs, persistent, to the durable fanout exchange topic
// (declared on first use) in order, without waiting; wait returns once the
// broker confirmed all of them, or with the first nack, after the timeout
// or when ctx is done. It implements events.AsyncPublisher.
func (p *asyncPublisher) PublishAsync(topic string, msgs ...*message.Message) (wait func(ctx context.Context) error, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, err := p.channel()
	if err != nil {
		return nil, fmt.Errorf("amqpbridge: publishing to %s: %w", topic, err)
	}
	exchange := p.cfg.Exchange.GenerateName(topic)
	if !p.declared[exchange] {
		x := p.cfg.Exchange
		if err := ch.ExchangeDeclare(exchange, x.Type, x.Durable, x.AutoDeleted, x.Internal, x.NoWait, x.Arguments); err != nil {
			p.reset()
			return nil, fmt.Errorf("amqpbridge: declaring exchange %s: %w", exchange, err)
		}
		p.declared[exchange] = true
	}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		pub, err := p.m.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("amqpbridge: %w", err)
		}
		dc, err := ch.PublishWithDeferredConfirm(exchange, "", false, false, pub)
		if err != nil {
			p.reset()
			return nil, fmt.Errorf("amqpbridge: publishing to %s: %w", exchange, err)
		}
		confirms = append(confirms, dc)
	}
	sent := time.Now()
	return func(ctx context.Context) error {
		ctx, cancel := context.WithDeadline(ctx, sent.Add(p.timeout))
		defer cancel()
		for _, dc := range confirms {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("amqpbridge: publishing to %s: no confirm: %w", exchange, err)
			}
			if !ok {
				return fmt.Errorf("amqpbridge: publishing to %s: the broker refused the message (nack, or the channel closed)", exchange)
			}
		}
		return nil
	}, nil
}

// Close closes the connection.
func (p *asyncPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.reset()
	return nil
}
