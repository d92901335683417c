package events

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// Config configures a Stream. Publisher is required; every other field has a
// default.
type Config struct {
	// Schema holds pgwake's tables. Default "pgwake".
	Schema string
	// Slot is the logical replication slot's name ([a-z0-9_], at most 63
	// bytes). The slot is created (pgoutput) if it does not exist and
	// persists across restarts: it is where the stream resumes. Default
	// "<schema>_events". A slot whose consumer is gone retains WAL without
	// bound: drop it with DropSlot when it is no longer used.
	Slot string
	// TemporarySlot makes the slot temporary: dropped by the server when the
	// connection ends. After a reconnect a new slot starts at the current
	// WAL position, so events committed meanwhile are not streamed. For
	// tailing, not for forwarding. Default false.
	TemporarySlot bool
	// Publication is the publication on <schema>.events (inserts only). It is
	// created if it does not exist, which needs ownership of the table.
	// Default "<schema>_events".
	Publication string
	// Publisher receives every event as a Watermill message. Required.
	Publisher message.Publisher
	// Topic names the topic of an event. Default SingleTopic("pgwake.events").
	Topic TopicFunc
	// ReplConnConfig is the replication connection's config. Default: the
	// pool's connection config with replication=database. Its user needs
	// the REPLICATION attribute (or superuser).
	ReplConnConfig *pgconn.Config
	// StatusInterval is the longest time between two standby status updates
	// (acknowledgements) to the server; it must be well under the server's
	// wal_sender_timeout (default 60s). Default 10s.
	StatusInterval time.Duration
	// MaxBatch bounds the events published per acknowledgement round, and
	// the events of one transaction held in memory: a larger transaction is
	// published in parts of MaxBatch (its position is acknowledged after the
	// last). Default 1000.
	MaxBatch int
	// MinBackoff and MaxBackoff bound the exponential backoff (with jitter)
	// between reconnects and between publish retries. Defaults 100ms, 10s.
	MinBackoff, MaxBackoff time.Duration
	// LagInterval is how often the slot's lag is measured. Default 10s.
	LagInterval time.Duration
	// LagWarnBytes logs a warning when the slot retains more WAL than this.
	// Default 1 GiB; negative disables.
	LagWarnBytes int64
	// LagWarnAge logs a warning when the transaction being published
	// committed longer ago than this. Default 5m; negative disables.
	LagWarnAge time.Duration
	// Logger gets the stream's logs. Default zap.NewNop().
	Logger *zap.Logger
	// Registerer gets the stream's metrics (docs/events.md). Default: none.
	Registerer prometheus.Registerer
}

// ErrInvalidConfig is wrapped by configuration errors from New.
var ErrInvalidConfig = errors.New("invalid events config")

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = migrations.DefaultSchema
	}
	if c.Slot == "" {
		c.Slot = c.Schema + "_events"
	}
	if c.Publication == "" {
		c.Publication = c.Schema + "_events"
	}
	if c.Topic == nil {
		c.Topic = SingleTopic("pgwake.events")
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = 10 * time.Second
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 1000
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 10 * time.Second
	}
	if c.LagInterval == 0 {
		c.LagInterval = 10 * time.Second
	}
	if c.LagWarnBytes == 0 {
		c.LagWarnBytes = 1 << 30
	}
	if c.LagWarnAge == 0 {
		c.LagWarnAge = 5 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

func (c Config) validate() error {
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return err
	}
	if err := ValidateSlotName(c.Slot); err != nil {
		return err
	}
	if err := sqlident.Validate("publication name", c.Publication, 0); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Publisher == nil {
		return fmt.Errorf("%w: Publisher is nil", ErrInvalidConfig)
	}
	if c.StatusInterval < 0 || c.MaxBatch < 0 || c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff || c.LagInterval < 0 {
		return fmt.Errorf("%w: negative interval, batch or backoff (or MaxBackoff < MinBackoff)", ErrInvalidConfig)
	}
	return nil
}

// ErrInvalidSlotName is wrapped by the error for a slot name that is not a
// plain identifier.
var ErrInvalidSlotName = errors.New("invalid replication slot name")

// ValidateSlotName checks a replication slot name: 1 to 63 bytes of
// [a-z0-9_], not starting with a digit (PostgreSQL allows the digit; we
// use the same rule as for every identifier).
func ValidateSlotName(name string) error {
	if err := sqlident.Validate("replication slot name", name, 0); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSlotName, err)
	}
	return nil
}

// TopicFunc names the topic an event is published to.
type TopicFunc func(Event) string

// SingleTopic publishes every event to one topic.
func SingleTopic(topic string) TopicFunc { return func(Event) string { return topic } }

// TopicPerType publishes to prefix + "." + event type, e.g.
// "pgwake.events.succeeded".
func TopicPerType(prefix string) TopicFunc {
	return func(e Event) string { return prefix + "." + e.Type }
}

// TopicPerQueue publishes to prefix + "." + queue, e.g. "pgwake.events.emails".
func TopicPerQueue(prefix string) TopicFunc {
	return func(e Event) string { return prefix + "." + e.Queue }
}
