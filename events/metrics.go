package events

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	published     *prometheus.CounterVec
	publishErrors prometheus.Counter
	reconnects    prometheus.Counter
	skipped       *prometheus.CounterVec
	deadLettered  prometheus.Counter
	lagBytes      prometheus.Collector
	lagSeconds    prometheus.Collector
}

// newMetrics registers the stream's metrics; the lag gauges call lagBytes
// and lagSeconds when scraped.
func newMetrics(reg prometheus.Registerer, slot string, lagBytes, lagSeconds func() float64) (*metrics, error) {
	labels := prometheus.Labels{"slot": slot}
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "pgwake_events_published_total",
			Help:        "Events published to the sink, by event type (re-publications after a restart count again).",
			ConstLabels: labels,
		}, []string{"type"}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "pgwake_events_publish_errors_total",
			Help:        "Failed Publish calls (each is retried).",
			ConstLabels: labels,
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "pgwake_events_reconnects_total",
			Help:        "Replication sessions that ended with an error and were retried.",
			ConstLabels: labels,
		}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "pgwake_events_skipped_total",
			Help:        "Events that could not be decoded and were skipped (each is logged with its id), by reason.",
			ConstLabels: labels,
		}, []string{"reason"}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "pgwake_events_dead_lettered_total",
			Help:        "Events their topic refused PublishAttempts times and the dead-letter topic took (each is logged with its id).",
			ConstLabels: labels,
		}),
		lagBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "pgwake_events_slot_lag_bytes",
			Help:        "WAL the slot retains: pg_current_wal_lsn() - confirmed_flush_lsn, measured when scraped.",
			ConstLabels: labels,
		}, lagBytes),
		lagSeconds: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "pgwake_events_slot_lag_seconds",
			Help:        "Age of the oldest transaction received but not yet published, when scraped (0 when caught up).",
			ConstLabels: labels,
		}, lagSeconds),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.published, m.publishErrors, m.reconnects, m.skipped, m.deadLettered, m.lagBytes, m.lagSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("events: register metrics: %w", err)
		}
	}
	return m, nil
}
