package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/amqpbridge"
	"github.com/pgwake/pgwake/events/natsbridge"
	"github.com/pgwake/pgwake/internal/termsafe"
)

func init() {
	register(command{
		name:    "events",
		summary: "the event log: tail, forward to NATS/RabbitMQ, replay, verify, slots",
		usage: `Usage: pgwake events tail [--slot NAME] [--publication NAME]
       pgwake events forward --to nats://HOST:4222 | amqp://USER:PASS@HOST:5672/ [--slot NAME]
                             [--topic T] [--topic-by type|queue] [--dead-letter-topic T|off]
                             [--publication NAME] [--lag-warn-bytes N] [--metrics-addr ADDR]
       pgwake events replay [--after-id N] [--since TIME|DURATION]
       pgwake events verify
       pgwake events slots [--json]
       pgwake events drop-slot --slot NAME [--terminate]
       pgwake events prune --older-than DURATION [--batch N]

The event log (<schema>.events) streamed out of PostgreSQL by logical
replication (needs wal_level = logical and a role with REPLICATION), or read
from the table. Events are JSON objects, one per line, in the versioned
encoding of docs/events.md.

tail       live events on stdout, each once, without gaps across reconnects.
           Without --slot a slot of this run (<schema>_tail_<random>) is
           used and dropped on exit (after a SIGKILL it stays: drop it with
           drop-slot); with --slot the persistent slot resumes where the last
           run stopped and is kept (drop it when done: it retains WAL).
forward    a long-running forwarder to NATS JetStream (--to nats://...) or
           RabbitMQ (--to amqp://...): at-least-once, in commit order,
           resumable from the slot (default <schema>_events) after any crash.
           Topic: --topic (default pgwake.events), or --topic-by type|queue
           for <topic>.<type> / <topic>.<queue> (a name that is no valid
           subject is escaped: a..b -> a%2E%2Eb). An event its topic refuses
           5 times while --dead-letter-topic (default <topic>._dead_letter)
           accepts it goes there, logged with its id; a broker outage
           refuses both and is retried. NATS: the JetStream stream
           --nats-stream (default PGWAKE_EVENTS) is created for <topic> and
           <topic>.>, or an existing one gets them added. RabbitMQ: a
           durable fanout exchange per topic.
replay     events from the table in id order, from --after-id and/or --since
           (RFC 3339 time, or a duration meaning that long ago).
verify     rebuild every job's state from the events and compare it with the
           jobs table; exit 1 on any difference.
slots      logical replication slots with their lag. A slot whose consumer
           is gone retains WAL without bound: drop it.
drop-slot  drop a slot; an active one only with --terminate.
prune      delete events older than --older-than of jobs that finished before
           then, in batches; unfinished jobs keep their history.

Examples:
  pgwake events tail
  pgwake events forward --to nats://127.0.0.1:4222 --topic-by queue
  pgwake events replay --since 1h
  pgwake events drop-slot --slot pgwake_events
  pgwake events prune --older-than 336h`,
		run: runEvents,
	})
}

func runEvents(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			env.printHelp(env.flags())
			return errHelp
		}
		return usagef("expected an action: tail, forward, replay, verify, slots, drop-slot or prune")
	}
	action, rest := args[0], args[1:]
	switch action {
	case "tail":
		return eventsTail(ctx, env, rest)
	case "forward":
		return eventsForward(ctx, env, rest)
	case "replay":
		return eventsReplay(ctx, env, rest)
	case "verify":
		return eventsVerify(ctx, env, rest)
	case "slots":
		return eventsSlots(ctx, env, rest)
	case "drop-slot":
		return eventsDropSlot(ctx, env, rest)
	case "prune":
		return eventsPrune(ctx, env, rest)
	}
	return usagef("unknown action %q: use tail, forward, replay, verify, slots, drop-slot or prune", action)
}

// linePublisher is a Watermill publisher that writes each message's payload
// as one line. With dedupe it skips a message at or before the last one it
// wrote (by commit LSN, then event id): a stream resuming from its slot
// after a reconnect publishes the unacknowledged tail again, and a person
// watching should see each event once.
type linePublisher struct {
	mu     sync.Mutex
	w      *bufio.Writer
	dedupe bool
	lsn    pglogrepl.LSN
	id     int64
}

func (p *linePublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if p.dedupe {
			lsn, err := events.MessageLSN(m)
			if err != nil {
				return err
			}
			id, err := events.MessageEventID(m)
			if err != nil {
				return err
			}
			if lsn < p.lsn || (lsn == p.lsn && id <= p.id) {
				continue // written before the reconnect
			}
			p.lsn, p.id = lsn, id
		}
		if _, err := termsafe.JSON(p.w).Write(m.Payload); err != nil { // one event per Write
			return err
		}
		if err := p.w.WriteByte('\n'); err != nil {
			return err
		}
	}
	return p.w.Flush()
}

func (p *linePublisher) Close() error { return nil }

func eventsTail(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	slot := fs.String("slot", "", "persistent slot to resume from and keep (default: a slot of this run, dropped on exit)")
	pubName := fs.String("publication", "", "publication on the events table (default <schema>_events)")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	own := *slot == ""
	if own {
		base := env.schema
		if len(base) > 40 {
			base = base[:40]
		}
		*slot = base + "_tail_" + randomSuffix()
	}
	if err := events.ValidateSlotName(*slot); err != nil {
		return usagef("--slot: %v", err)
	}
	pool, err := env.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// A slot of this run, not a temporary one: a temporary slot dies with
	// its connection, and its successor after a reconnect would start at
	// the current WAL position, skipping what was committed meanwhile.
	s, err := events.New(pool, events.Config{Schema: env.schema, Slot: *slot,
		Publication: *pubName, Publisher: &linePublisher{w: bufio.NewWriter(env.stdout), dedupe: true}, Logger: env.log,
		StatusInterval: 5 * time.Second})
	if err != nil {
		return usagef("%v", err)
	}
	if own {
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := events.DropSlot(dctx, pool, *slot, true); err != nil && !errors.Is(err, events.ErrSlotNotFound) {
				env.log.Warn("could not drop the tail's slot; drop it with pgwake events drop-slot", zap.String("slot", *slot), zap.Error(err))
			}
		}()
	}
	env.log.Info("tailing events", zap.String("slot", *slot), zap.Bool("dropped_on_exit", own))
	return s.Run(ctx)
}

func eventsForward(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	to := fs.String("to", "", "broker URL: nats://HOST:4222 or amqp://USER:PASS@HOST:5672/ (default $"+envBrokerURL+"; one of them is required; prefer the variable for a URL with a password: flags show in ps)")
	slot := fs.String("slot", "", "replication slot (default <schema>_events)")
	pubName := fs.String("publication", "", "publication on the events table (default <schema>_events)")
	topic := fs.String("topic", "pgwake.events", "topic, or topic prefix with --topic-by")
	topicBy := fs.String("topic-by", "", "one topic per event type or queue: type, queue (default one topic)")
	deadLetter := fs.String("dead-letter-topic", "", "topic for an event its own topic refuses 5 times while this one accepts it (default <topic>._dead_letter; \"off\": retry for ever)")
	natsStream := fs.String("nats-stream", "PGWAKE_EVENTS", "JetStream stream for NATS")
	metricsAddr := fs.String("metrics-addr", "127.0.0.1:9465", "address for /metrics and /healthz; \"off\" to disable")
	lagWarn := fs.Int64("lag-warn-bytes", 1<<30, "warn when the slot retains more WAL than this")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	if *to == "" {
		*to = os.Getenv(envBrokerURL)
	}
	topicFn, err := forwardTopics(*topicBy, *topic)
	if err != nil {
		return err
	}
	if *slot != "" {
		if err := events.ValidateSlotName(*slot); err != nil {
			return usagef("--slot: %v", err)
		}
	}
	switch *deadLetter {
	case "":
		*deadLetter = *topic + "._dead_letter"
	case "off":
		*deadLetter = ""
	}
	pub, err := forwardPublisher(*to, *natsStream, *topic)
	if err != nil {
		return err
	}
	defer pub.Close()
	pool, err := env.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := newRegistry()
	s, err := events.New(pool, events.Config{Schema: env.schema, Slot: *slot, Publication: *pubName,
		Publisher: pub, Topic: topicFn, DeadLetterTopic: *deadLetter, Logger: env.log, Registerer: reg, LagWarnBytes: *lagWarn})
	if err != nil {
		return usagef("%v", err)
	}
	fields := []zap.Field{zap.String("slot", s.Slot()), zap.String("to", redactBrokerURL(*to))}
	if !metricsOff(*metricsAddr) {
		ms, err := listenMetrics(*metricsAddr, reg, pool, env.log)
		if err != nil {
			return err
		}
		go ms.serve(env.log)
		defer ms.shutdown()
		fields = append(fields, zap.String("metrics", "http://"+ms.addr+"/metrics"))
	}
	env.log.Info("forwarding events", fields...)
	if err := s.Run(ctx); err != nil {
		return err
	}
	env.log.Info("forwarder stopped", zap.String("acked", s.Acked().String()))
	return nil
}

// forwardTopics is the topic function of --topic-by.
func forwardTopics(by, topic string) (events.TopicFunc, error) {
	switch by {
	case "":
		return events.SingleTopic(topic), nil
	case "type":
		return events.TopicPerType(topic), nil
	case "queue":
		return events.TopicPerQueue(topic), nil
	}
	return nil, usagef("--topic-by %q: use type or queue", by)
}

// forwardPublisher is the publisher of the broker URL to: NATS JetStream
// (stream natsStream capturing topic and its subtopics) or AMQP.
func forwardPublisher(to, natsStream, topic string) (message.Publisher, error) {
	switch {
	case to == "":
		return nil, usagef("--to or %s is required: nats://HOST:4222 or amqp://USER:PASS@HOST:5672/", envBrokerURL)
	case strings.HasPrefix(to, "nats://") || strings.HasPrefix(to, "tls://"):
		return natsbridge.NewPublisher(natsbridge.Config{URL: to, Stream: natsStream, Subjects: []string{topic, topic + ".>"}})
	case strings.HasPrefix(to, "amqp://") || strings.HasPrefix(to, "amqps://"):
		return amqpbridge.NewPublisher(amqpbridge.Config{URL: to})
	}
	return nil, usagef("--to %q: use a nats:// or amqp:// URL", redactBrokerURL(to))
}

// redactBrokerURL hides a broker URL's credentials: NATS takes a token as
// the user part, so the whole user part goes.
func redactBrokerURL(s string) string {
	if strings.HasPrefix(s, "amqp") {
		return redactURL(s)
	}
	return natsbridge.RedactURL(s)
}

// parseSince reads an RFC 3339 time or a duration meaning that long ago.
func parseSince(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a duration (90m)", s)
}

func eventsReplay(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	afterID := fs.Int64("after-id", 0, "only events with a larger id")
	since := fs.String("since", "", "only events from this RFC 3339 time, or this long ago (e.g. 1h)")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	t, err := parseSince(*since)
	if err != nil {
		return usagef("--since: %v", err)
	}
	if *afterID < 0 {
		return usagef("--after-id must not be negative")
	}
	pool, err := env.connectSchema(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	w := bufio.NewWriter(env.stdout)
	jw := termsafe.JSON(w) // one event per Write
	err = events.Read(ctx, pool, env.schema, events.From{AfterID: *afterID, Since: t}, func(e events.Event) error {
		b, err := events.Encode(e)
		if err != nil {
			return err
		}
		if _, err := jw.Write(b); err != nil {
			return err
		}
		return w.WriteByte('\n')
	})
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	return err
}

func eventsVerify(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	pool, err := env.connectSchema(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	mismatches, err := events.Verify(ctx, pool, env.schema)
	if err != nil {
		return err
	}
	for _, m := range mismatches {
		fmt.Fprintln(env.stdout, m)
	}
	if len(mismatches) > 0 {
		return fmt.Errorf("%d jobs differ between the event log and the jobs table", len(mismatches))
	}
	fmt.Fprintln(env.stdout, "ok: the event log and the jobs table agree")
	return nil
}

func eventsSlots(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	pool, err := env.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	slots, err := events.Slots(ctx, pool)
	if err != nil {
		return err
	}
	return printSlots(env.stdout, slots, *asJSON)
}

func printSlots(w io.Writer, slots []events.SlotInfo, asJSON bool) error {
	if asJSON {
		type row struct {
			Name           string `json:"name"`
			Plugin         string `json:"plugin"`
			Database       string `json:"database"`
			Temporary      bool   `json:"temporary"`
			Active         bool   `json:"active"`
			ActivePID      int    `json:"active_pid,omitempty"`
			ConfirmedFlush string `json:"confirmed_flush_lsn"`
			LagBytes       int64  `json:"lag_bytes"`
			WALStatus      string `json:"wal_status"`
		}
		rows := make([]row, 0, len(slots))
		for _, s := range slots {
			rows = append(rows, row{s.Name, s.Plugin, s.Database, s.Temporary, s.Active, s.ActivePID, s.ConfirmedFlush.String(), s.LagBytes, s.WALStatus})
		}
		enc := json.NewEncoder(termsafe.JSON(w))
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if len(slots) == 0 {
		_, err := fmt.Fprintln(w, "no logical replication slots")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tPLUGIN\tDATABASE\tACTIVE\tCONFIRMED\tLAG\tWAL_STATUS")
	for _, s := range slots {
		active := "no"
		if s.Active {
			active = fmt.Sprintf("pid %d", s.ActivePID)
		}
		if s.Temporary {
			active += " (temporary)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Plugin, s.Database, active, s.ConfirmedFlush, humanBytes(s.LagBytes), s.WALStatus)
	}
	return tw.Flush()
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func eventsDropSlot(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	slot := fs.String("slot", "", "slot to drop (required)")
	terminate := fs.Bool("terminate", false, "end the slot's consumer first if it is active")
	if err := env.parse(fs, args); err != nil {
		return err
	}
	if *slot == "" && fs.NArg() == 1 {
		*slot = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *slot == "" {
		return usagef("--slot is required")
	}
	if err := events.ValidateSlotName(*slot); err != nil {
		return usagef("--slot: %v", err)
	}
	pool, err := env.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := events.DropSlot(ctx, pool, *slot, *terminate); err != nil {
		if errors.Is(err, events.ErrSlotActive) {
			return fmt.Errorf("%w (or pass --terminate)", err)
		}
		return err
	}
	fmt.Fprintf(env.stdout, "dropped slot %s\n", *slot)
	return nil
}

func eventsPrune(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	olderThan := fs.Duration("older-than", 0, "delete events older than this, of jobs finished before then (required, e.g. 336h)")
	batch := fs.Int("batch", events.DefaultPruneBatch, "events examined per DELETE statement, in id order")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	if *olderThan <= 0 {
		return usagef("--older-than is required and must be positive, e.g. 336h")
	}
	if *batch <= 0 {
		return usagef("--batch must be positive")
	}
	pool, err := env.connectSchema(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := events.DeleteBefore(ctx, pool, env.schema, time.Now().Add(-*olderThan), *batch)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "deleted %d events\n", n)
	return nil
}
