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
	returns  *returns        // messages ch got back as unroutable
	declared map[string]bool // exchanges declared on ch
	closed   bool
}

// returns records the messages a channel got back (basic.return): a
// mandatory message no queue takes. RabbitMQ sends the return before the
// message's confirm, and amqp091 hands it over before it handles the
// confirm, so once a message is confirmed, a sync through the goroutine
// that records returns tells whether it came back.
type returns struct {
	mu    sync.Mutex
	uuids map[string]bool
	sync  chan struct{}
	done  chan struct{} // the channel closed; every return is recorded
}

func watchReturns(ch *amqp.Channel) *returns {
	r := &returns{uuids: map[string]bool{}, sync: make(chan struct{}), done: make(chan struct{})}
	in := ch.NotifyReturn(make(chan amqp.Return))
	go func() {
		defer close(r.done)
		for {
			select {
			case ret, ok := <-in:
				if !ok {
					return
				}
				uuid, _ := ret.Headers[wmamqp.DefaultMessageUUIDHeaderKey].(string)
				r.mu.Lock()
				r.uuids[uuid] = true
				r.mu.Unlock()
			case <-r.sync:
			}
		}
	}()
	return r
}

// returned reports (and forgets) whether the message of uuid, confirmed,
// came back.
func (r *returns) returned(ctx context.Context, uuid string) bool {
	select {
	case r.sync <- struct{}{}:
	case <-r.done:
	case <-ctx.Done():
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ret := r.uuids[uuid]
	delete(r.uuids, uuid)
	return ret
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
	p.returns = watchReturns(ch)
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
	rets := p.returns
	for _, m := range msgs {
		pub, err := p.m.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("amqpbridge: %w", err)
		}
		// Mandatory: a message no queue takes comes back instead of being
		// confirmed and dropped (TestEventsWithNoQueueBoundAreNotLost).
		dc, err := ch.PublishWithDeferredConfirm(exchange, "", true, false, pub)
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
		for i, dc := range confirms {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("amqpbridge: publishing to %s: no confirm: %w", exchange, err)
			}
			if !ok {
				return fmt.Errorf("amqpbridge: publishing to %s: the broker refused the message (nack, or the channel closed)", exchange)
			}
			if rets.returned(ctx, msgs[i].UUID) {
				return fmt.Errorf("amqpbridge: publishing to %s: %w: bind a queue to the exchange; the stream holds the events until one is", exchange, ErrNoQueue)
			}
		}
		return nil
	}, nil
}

// syncPublisher publishes one message at a time, each confirmed before
// the next is sent.
type syncPublisher struct{ *asyncPublisher }

// Publish sends msgs in order, awaiting each one's confirm.
func (p syncPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if err := p.asyncPublisher.Publish(topic, m); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the connection.
func (p *asyncPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.reset()
	return nil
}
