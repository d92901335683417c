package events

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	published     *prometheus.CounterVec
	publishErrors prometheus.Counter
	reconnects    prometheus.Counter
	lagBytes      prometheus.Gauge
	lagSeconds    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, slot string) (*metrics, error) {
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
		lagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "pgwake_events_slot_lag_bytes",
			Help:        "WAL the slot retains: pg_current_wal_lsn() - confirmed_flush_lsn.",
			ConstLabels: labels,
		}),
		lagSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "pgwake_events_slot_lag_seconds",
			Help:        "Age of the oldest transaction received but not yet published (0 when caught up).",
			ConstLabels: labels,
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.published, m.publishErrors, m.reconnects, m.lagBytes, m.lagSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("events: register metrics: %w", err)
		}
	}
	return m, nil
}
