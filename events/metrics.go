package events

import (
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgwake/pgwake/internal/promreg"
)

type metrics struct {
	published     *prometheus.CounterVec
	publishErrors prometheus.Counter
	reconnects    prometheus.Counter
	skipped       *prometheus.CounterVec
	deadLettered  prometheus.Counter
	lagBytes      *lagGauge
	lagSeconds    *lagGauge
}

// lagGauge is a gauge measured when scraped by the function of the last
// stream registered with it: a stream made again on its registry (after
// Run returned) reports its own lag, not the first stream's.
type lagGauge struct {
	desc *prometheus.Desc
	fn   atomic.Pointer[func() float64]
}

func newLagGauge(desc *prometheus.Desc, fn func() float64) *lagGauge {
	g := &lagGauge{desc: desc}
	g.fn.Store(&fn)
	return g
}

func (g *lagGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *lagGauge) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, (*g.fn.Load())())
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
		lagBytes: newLagGauge(prometheus.NewDesc("pgwake_events_slot_lag_bytes",
			"WAL the slot retains: pg_current_wal_lsn() - confirmed_flush_lsn, measured when scraped.", nil, labels), lagBytes),
		lagSeconds: newLagGauge(prometheus.NewDesc("pgwake_events_slot_lag_seconds",
			"Age of the oldest transaction received but not yet published, when scraped (0 when caught up).", nil, labels), lagSeconds),
	}
	if reg == nil {
		return m, nil
	}
	// A stream made again for the slot on its registry shares the
	// collectors already there (TestStreamMadeAgainOnItsRegistry).
	err := promreg.RegisterAll(reg, &m.published, &m.skipped)
	if err == nil {
		err = promreg.RegisterAll(reg, &m.publishErrors, &m.reconnects, &m.deadLettered)
	}
	if err == nil {
		err = promreg.RegisterAll(reg, &m.lagBytes, &m.lagSeconds)
	}
	if err != nil {
		return nil, fmt.Errorf("events: register metrics: %w", err)
	}
	m.lagBytes.fn.Store(&lagBytes)
	m.lagSeconds.fn.Store(&lagSeconds)
	return m, nil
}
