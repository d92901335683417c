package events

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/backoff"
)

// AsyncPublisher is a Publisher that can send without waiting for the
// broker. A Stream whose Publisher implements it keeps up to 4*MaxBatch
// events on the wire while it awaits their acknowledgements in order,
// instead of one round trip per batch. natsbridge's default
// publisher implements it.
type AsyncPublisher interface {
	message.Publisher
	// PublishAsync sends msgs to topic in order and returns without waiting
	// for the broker; wait blocks until the broker stored every one of
	// them, or returns the first error or ctx's (then the caller publishes
	// them again). An error from PublishAsync itself means nothing needs
	// to be awaited.
	PublishAsync(topic string, msgs ...*message.Message) (wait func(ctx context.Context) error, err error)
}

// shutdownGrace is how long, once the stream is stopping, it still awaits
// the broker's acknowledgements of what it sent, so that they are
// acknowledged to the server before it leaves.
const shutdownGrace = 5 * time.Second

// maxFlights bounds the batches sent and not yet acknowledged; the events
// in them are bounded by 4*MaxBatch (inFlightBatches).
const maxFlights = 1024

// inFlightBatches times MaxBatch bounds the events sent and not yet
// acknowledged by the broker.
const inFlightBatches = 4

// run is consecutive events of one topic, published in one call.
type run struct {
	topic string
	msgs  []*message.Message
	types []Type
	wait  func(context.Context) error // nil when published synchronously or not sent yet
}

// flight is one batch of transactions on its way to the broker.
type flight struct {
	txns   []*txn
	runs   []*run
	events int
}

// publishLoop takes handed-over transactions in batches of up to MaxBatch
// events, encodes them and sends them; confirmLoop awaits the broker's
// acknowledgements in order and advances the published position. Encoding
// and sending the next batch overlap with awaiting the previous ones.
// Each publication waits for fn's check that the slot still streams to
// this session (fence.go).
func (s *Stream) publishLoop(ctx context.Context, txns <-chan *txn, fn *fence) error {
	flights := make(chan *flight, maxFlights-1)
	confirmed := make(chan error, 1)
	var inflight atomic.Int64      // events in flights not yet confirmed
	room := make(chan struct{}, 1) // a flight was confirmed
	go func() { confirmed <- s.confirmLoop(ctx, flights, &inflight, room, fn) }()
	stop := func(err error) error {
		close(flights)
		if cerr := <-confirmed; err == nil {
			err = cerr
		}
		return err
	}
	async, _ := s.cfg.Publisher.(AsyncPublisher)
	for {
		var batch []*txn
		select {
		case t := <-txns:
			batch = append(batch, t)
		case <-ctx.Done():
			return stop(nil)
		case err := <-confirmed:
			close(flights)
			return err
		}
		batch, n := s.gather(batch, txns)
		// Wait for room on the wire: few events in flight keep the
		// commit-to-broker time short, a bound keeps memory bounded.
		for inflight.Load() > 0 && inflight.Load()+int64(n) > int64(inFlightBatches*s.cfg.MaxBatch) {
			select {
			case <-room:
			case err := <-confirmed:
				close(flights)
				return err
			}
		}
		// Not after the session ended, nor when another session took the
		// slot while this process was paused.
		if err := fn.check(ctx); err != nil {
			return stop(notOurs(err))
		}
		f := &flight{txns: batch, runs: s.encode(batch), events: n}
		inflight.Add(int64(n))
		if err := s.sendRuns(ctx, f, async, fn); err != nil {
			return stop(notOurs(err)) // or stopped mid-retry; nothing of the batch is acknowledged
		}
		// Handed over even when ctx is done: confirmLoop counts what was
		// sent, and awaits it, until flights is closed.
		select {
		case flights <- f:
		case err := <-confirmed:
			close(flights)
			return err
		}
	}
}

// gather adds to batch what else was handed over, up to MaxBatch events,
// without waiting; n is the batch's events.
func (s *Stream) gather(batch []*txn, txns <-chan *txn) ([]*txn, int) {
	n := len(batch[0].events)
	for n < s.cfg.MaxBatch {
		select {
		case t := <-txns:
			batch = append(batch, t)
			n += len(t.events)
		default:
			return batch, n
		}
	}
	return batch, n
}

// sendRuns sends f's runs: asynchronously when the publisher can, else
// (or when the async send failed) here, retrying until it succeeds. An
// error is errNotOurs or the stop (ctx) in the middle of a retry.
func (s *Stream) sendRuns(ctx context.Context, f *flight, async AsyncPublisher, fn *fence) error {
	for _, r := range f.runs {
		if async != nil {
			wait, err := async.PublishAsync(r.topic, r.msgs...)
			if err == nil {
				r.wait = wait
				continue
			}
			s.publishFailed(r, err)
		}
		if err := s.publishRun(ctx, r, async != nil, fn); err != nil {
			return err
		}
	}
	return nil
}

// confirmLoop awaits each flight's acknowledgements in order, publishes
// again what the broker refused, and then advances the published position
// past the flight's whole transactions.
func (s *Stream) confirmLoop(ctx context.Context, flights <-chan *flight, inflight *atomic.Int64, room chan<- struct{}, fn *fence) error {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(shutdownGrace, cancel) })
	defer stopGrace()
	for f := range flights {
		for _, r := range f.runs {
			if r.wait == nil {
				continue
			}
			if err := r.wait(wctx); err != nil {
				s.publishFailed(r, err)
				if err := s.publishRun(ctx, r, true, fn); err != nil {
					return notOurs(err) // or stopped mid-retry
				}
			}
		}
		for _, r := range f.runs {
			for _, t := range r.types {
				s.m.published.WithLabelValues(string(t)).Inc()
			}
		}
		// The end of the last whole transaction in the batch; a trailing
		// part of an unfinished one moves nothing.
		var last *txn
		for _, t := range f.txns {
			if uint64(t.end) > s.published.Load() {
				s.published.Store(uint64(t.end))
			}
			last = t
		}
		inflight.Add(-int64(f.events))
		select {
		case room <- struct{}{}:
		default:
		}
		if s.publishedTxn.Add(uint64(len(f.txns))) >= s.handed.Load() {
			s.pendingSince.Store(0)
		} else {
			// The next transaction committed after this one: its age is
			// at most this one's.
			s.pendingSince.Store(last.commitTime.UnixNano())
		}
	}
	return nil
}

// encode turns a batch into runs of one topic, in order. An event that
// cannot be encoded is skipped (logged with its id and counted).
func (s *Stream) encode(batch []*txn) []*run {
	var runs []*run
	var cur *run
	for _, t := range batch {
		for _, e := range t.events {
			msg, err := NewMessage(s.cfg.Schema, e, t.commitLSN)
			if err != nil {
				s.skip(e.ID, "encode", err)
				continue
			}
			tp, err := s.topic(e)
			if err != nil {
				s.skip(e.ID, "topic", err)
				continue
			}
			if cur == nil || cur.topic != tp {
				cur = &run{topic: tp}
				runs = append(runs, cur)
			}
			cur.msgs = append(cur.msgs, msg)
			cur.types = append(cur.types, e.Type)
		}
	}
	return runs
}

// topic is Config.Topic's topic for e; a panic of it is an error: it
// crashed the process, and again at every restart, the slot never past the
// event (TestTopicFunctionThatPanics).
func (s *Stream) topic(e Event) (tp string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("Config.Topic panicked: %v", p)
		}
	}()
	return s.cfg.Topic(e), nil
}

// skip records an event the stream cannot forward: an error log line
// naming it and pgwake_events_skipped_total. The slot moves past it.
func (s *Stream) skip(id int64, reason string, err error) {
	s.m.skipped.WithLabelValues(reason).Inc()
	s.log.Error("event skipped: it cannot be forwarded; read it from the events table", zap.String("slot", s.cfg.Slot),
		zap.Int64("event_id", id), zap.String("reason", reason), zap.Error(err))
}

func (s *Stream) publishFailed(r *run, err error) {
	s.m.publishErrors.Inc()
	s.log.Warn("publish failed; retrying", zap.String("topic", r.topic), zap.Int("messages", len(r.msgs)), zap.Error(err))
}

// publishRun publishes r with Publish, retrying with backoff until it
// succeeds (failed: an attempt already failed, back off first); it returns
// an error only when ctx is done or fn finds the slot another session's
// (errNotOurs): every attempt waits for fn's check. With a DeadLetterTopic, after
// PublishAttempts failed attempts the messages go one by one, and one that
// its topic refuses goes to the dead-letter topic.
func (s *Stream) publishRun(ctx context.Context, r *run, failed bool, fn *fence) error {
	wait := s.cfg.MinBackoff
	attempts := 0
	if failed {
		attempts = 1
	}
	for {
		if failed {
			select {
			case <-time.After(backoff.Jitter(wait)):
			case <-ctx.Done():
				return ctx.Err()
			}
			wait = min(wait*2, s.cfg.MaxBackoff)
		}
		if err := fn.check(ctx); err != nil {
			return err
		}
		if s.cfg.DeadLetterTopic != "" && attempts >= s.cfg.PublishAttempts {
			if s.publishEach(r, true) {
				return nil
			}
		} else {
			err := s.cfg.Publisher.Publish(r.topic, r.msgs...)
			if err == nil {
				return nil
			}
			s.publishFailed(r, err)
			// A message the broker refuses for its size would be
			// refused for ever, here and by a dead-letter topic: publish
			// one by one and skip it (TestEventLargerThanMaxPayload).
			if errors.Is(err, ErrMessageTooLarge) && s.publishEach(r, false) {
				return nil
			}
		}
		attempts++
		failed = true
	}
}

// publishEach publishes r's messages one at a time; a message its topic
// refuses goes to the dead-letter topic, logged with its event id and
// counted. It returns false when the dead-letter topic refuses too: then
// the broker, not the message, is the problem, and r is retried whole. A
// message refused as too large (ErrMessageTooLarge) is skipped, logged
// with its id and counted; with deadLetter false any other refusal
// returns false at once.
func (s *Stream) publishEach(r *run, deadLetter bool) bool {
	for _, m := range r.msgs {
		err := s.cfg.Publisher.Publish(r.topic, m)
		if err == nil {
			continue
		}
		if errors.Is(err, ErrMessageTooLarge) {
			id, _ := MessageEventID(m)
			s.skip(id, "too_large", err)
			continue
		}
		if !deadLetter {
			s.publishFailed(r, err)
			return false
		}
		if derr := s.cfg.Publisher.Publish(s.cfg.DeadLetterTopic, m); derr != nil {
			s.publishFailed(r, errors.Join(err, derr))
			return false
		}
		id, _ := MessageEventID(m)
		s.m.deadLettered.Inc()
		s.log.Error("event sent to the dead-letter topic: its own topic refused it", zap.String("slot", s.cfg.Slot),
			zap.Int64("event_id", id), zap.String("topic", r.topic), zap.String("dead_letter_topic", s.cfg.DeadLetterTopic), zap.Error(err))
	}
	return true
}
