package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgwake/pgwake/internal/promreg"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// Outcomes of an attempt, the "outcome" label of processed jobs.
const (
	outcomeSucceeded   = "succeeded"
	outcomeRetry       = "retry"        // failed, retry scheduled
	outcomeFailed      = "failed"       // failed, attempts exhausted
	outcomeCommitError = "commit_error" // the outcome could not be recorded; the job runs again
	outcomeCancelled   = "cancelled"    // the handler returned Cancel, or returned nil but the job was cancelled meanwhile
	outcomeSnoozed     = "snoozed"      // the handler returned Snooze: pending again, attempt not counted
	outcomeLeaseLost   = "lease_lost"   // leased: the job was rescued or cancelled before the outcome was recorded
)

type metrics struct {
	reg         prometheus.Registerer
	enqueued    *prometheus.CounterVec
	processed   *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	wait        *prometheus.HistogramVec
	claims      *prometheus.CounterVec
	claimErrors *prometheus.CounterVec
	deleted     *prometheus.CounterVec
	rescued     *prometheus.CounterVec
	heartbeats  prometheus.Counter
	paused      *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, c *Client) (*metrics, error) {
	m := &metrics{
		reg: reg,
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_queue_enqueued_total",
			Help: "Jobs inserted by this process (counted when the statement ran; the caller's transaction may still roll back).",
		}, []string{"queue", "kind"}),
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_worker_jobs_total",
			Help: "Attempts finished, by outcome: succeeded, retry (failed, retry scheduled), failed (attempts exhausted), commit_error (outcome not recorded; the job runs again), cancelled (the handler returned Cancel, or the job was cancelled while its handler ran), snoozed (the handler returned Snooze), lease_lost (leased mode: the job was rescued or cancelled before its outcome was recorded).",
		}, []string{"queue", "kind", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pgwake_worker_job_duration_seconds",
			Help:    "Handler run time per attempt.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
		}, []string{"queue", "kind", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pgwake_worker_wait_seconds",
			Help:    "Queue latency: from when a job was due (run_after, or its insert) to its claim, by the database clock.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
		}, []string{"queue"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_worker_claims_total",
			Help: "Jobs claimed, by what made the worker look: start, notify, resync, scheduled, busy, released, recovered, recheck, poll. A growing poll count means notifications are being missed.",
		}, []string{"queue", "source"}),
		claimErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_worker_claim_errors_total",
			Help: "Claim attempts that failed with a database error.",
		}, []string{"queue"}),
		rescued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_worker_leases_rescued_total",
			Help: "Leased jobs whose lease expired, rescued by this process (counted as a failed attempt, retried with backoff).",
		}, []string{"queue"}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pgwake_worker_lease_heartbeats_total",
			Help: "Statements that extended this process's leases (one per LeaseDuration/3 while leased jobs run, whatever their number).",
		}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pgwake_queue_paused",
			Help: "1 while a queue this process works is paused (PauseQueue, pgwake queues pause), else 0.",
		}, []string{"queue"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_queue_jobs_deleted_total",
			Help: "Finished jobs deleted by retention (Config.Retention), by state.",
		}, []string{"state"}),
	}
	if reg == nil {
		return m, nil
	}
	// Several clients may share a registry (the subscriptions of a Watermill
	// subscriber, a process with more than one Client): they share the
	// series, which carry the queue as a label.
	if err := promreg.RegisterAll(reg, &m.enqueued, &m.processed, &m.claims, &m.claimErrors, &m.deleted, &m.rescued); err != nil {
		return nil, fmt.Errorf("queue: register metrics: %w", err)
	}
	if err := promreg.RegisterAll(reg, &m.paused); err != nil {
		return nil, fmt.Errorf("queue: register metrics: %w", err)
	}
	if err := promreg.RegisterAll(reg, &m.heartbeats); err != nil {
		return nil, fmt.Errorf("queue: register metrics: %w", err)
	}
	if err := promreg.RegisterAll(reg, &m.duration, &m.wait); err != nil {
		return nil, fmt.Errorf("queue: register metrics: %w", err)
	}
	depth, err := promreg.Register(reg, newDepthCollector(c))
	if err != nil {
		return nil, fmt.Errorf("queue: register metrics: %w", err)
	}
	if depth.schema != c.cfg.Schema {
		// Depth is read per schema: one registry, one schema.
		return nil, fmt.Errorf("queue: register metrics: the registry already reports queue depth for schema %q, not %q", depth.schema, c.cfg.Schema)
	}
	return m, nil
}

// listenerRegisterer is where the client's own listener registers its
// metrics. Nil (no metrics) when the client has no registerer.
func (m *metrics) listenerRegisterer() prometheus.Registerer { return m.reg }

func (m *metrics) observe(j *Job, outcome string, d time.Duration) {
	m.processed.WithLabelValues(j.Queue, j.Kind, outcome).Inc()
	m.duration.WithLabelValues(j.Queue, j.Kind, outcome).Observe(d.Seconds())
}

// depthCollector reports queue depth by queue and state at scrape time.
type depthCollector struct {
	c      *Client
	schema string
	desc   *prometheus.Desc
	sql    string
}

func newDepthCollector(c *Client) *depthCollector {
	jobs := sqlident.Quote(c.cfg.Schema, "jobs")
	return &depthCollector{
		c:      c,
		schema: c.cfg.Schema,
		desc: prometheus.NewDesc("pgwake_queue_depth",
			"Jobs per queue and state at scrape time: available (pending and due), scheduled (pending, not yet due), failed.",
			[]string{"queue", "state"}, nil),
		sql: `
SELECT queue, CASE WHEN run_after <= now() THEN 'available' ELSE 'scheduled' END, count(*)
FROM ` + jobs + ` WHERE state = 'pending' GROUP BY 1, 2
UNION ALL
SELECT queue, 'failed', count(*) FROM ` + jobs + ` WHERE state = 'failed' GROUP BY 1`,
	}
}

func (d *depthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

func (d *depthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := d.c.pool.Query(ctx, d.sql)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(d.desc, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var q, state string
		var n int64
		if err := rows.Scan(&q, &state, &n); err != nil {
			ch <- prometheus.NewInvalidMetric(d.desc, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(d.desc, prometheus.GaugeValue, float64(n), q, state)
	}
	if err := rows.Err(); err != nil {
		ch <- prometheus.NewInvalidMetric(d.desc, err)
	}
}
