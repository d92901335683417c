package queue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
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

// otherLabel is the label value of every kind with no registered handler and
// every queue this process does not work. Producers choose kinds and queues;
// a label value for each would grow the scrape without bound (2,000 invented
// kinds took it from 12.6 kB to 3.8 MB), and a kind that is not valid UTF-8
// (possible in a SQL_ASCII database) would make the Prometheus client panic.
const otherLabel = "other"

// labelSet is the kinds and queues reported by name: kinds with a handler
// and queues worked, of every client that shares a registry (the
// subscriptions of a Watermill subscriber and its publisher, say).
type labelSet struct {
	mu            sync.RWMutex
	kinds, queues map[string]bool
}

func newLabelSet() *labelSet {
	return &labelSet{kinds: map[string]bool{}, queues: map[string]bool{}}
}

// add reports the kinds with a handler and the queues of cfg by name.
func (l *labelSet) add(cfg Config) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range cfg.Handlers {
		if utf8.ValidString(k) {
			l.kinds[k] = true
		}
	}
	for q := range cfg.Queues {
		l.queues[q] = true
	}
}

// kind is the label value of kind: itself if it has a handler, else
// otherLabel.
func (l *labelSet) kind(kind string) string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.kinds[kind] {
		return kind
	}
	return otherLabel
}

// queue is the label value of queue: itself if it is worked, else
// otherLabel.
func (l *labelSet) queue(queue string) string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.queues[queue] {
		return queue
	}
	return otherLabel
}

// queueList is the queues reported by name.
func (l *labelSet) queueList() []string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]string, 0, len(l.queues))
	for q := range l.queues {
		out = append(out, q)
	}
	return out
}

type metrics struct {
	reg         prometheus.Registerer
	labels      *labelSet
	enqueued    *prometheus.CounterVec
	processed   *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	wait        *prometheus.HistogramVec
	claims      *prometheus.CounterVec
	claimErrors *prometheus.CounterVec
	deleted     *prometheus.CounterVec
	rescued     *prometheus.CounterVec
	heartbeats  prometheus.Counter
	heartbeatT  prometheus.Histogram
	paused      *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, c *Client) (*metrics, error) {
	m := &metrics{
		reg:    reg,
		labels: newLabelSet(),
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
		heartbeatT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pgwake_worker_lease_heartbeat_seconds",
			Help:    "Time of each statement that extended this process's leases, from its send to its last row read.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
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
		m.labels.add(c.cfg)
		return m, nil
	}
	if err := m.register(reg); err != nil {
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
	m.labels = depth.labels
	depth.pool.Store(c.pool)
	m.labels.add(c.cfg)
	return m, nil
}

// register registers m's collectors with reg. Several clients may share a
// registry (the subscriptions of a Watermill subscriber, a process with
// more than one Client): they share the series, which carry the queue as a
// label.
func (m *metrics) register(reg prometheus.Registerer) error {
	if err := promreg.RegisterAll(reg, &m.enqueued, &m.processed, &m.claims, &m.claimErrors, &m.deleted, &m.rescued); err != nil {
		return err
	}
	if err := promreg.RegisterAll(reg, &m.paused); err != nil {
		return err
	}
	if err := promreg.RegisterAll(reg, &m.heartbeats); err != nil {
		return err
	}
	if err := promreg.RegisterAll(reg, &m.heartbeatT); err != nil {
		return err
	}
	return promreg.RegisterAll(reg, &m.duration, &m.wait)
}

// listenerRegisterer is where the client's own listener registers its
// metrics. Nil (no metrics) when the client has no registerer.
func (m *metrics) listenerRegisterer() prometheus.Registerer { return m.reg }

// countEnqueued counts one job inserted.
func (m *metrics) countEnqueued(queue, kind string) {
	m.enqueued.WithLabelValues(m.labels.queue(queue), m.labels.kind(kind)).Inc()
}

func (m *metrics) observe(j *Job, outcome string, d time.Duration) {
	q, k := m.labels.queue(j.Queue), m.labels.kind(j.Kind)
	m.processed.WithLabelValues(q, k, outcome).Inc()
	m.duration.WithLabelValues(q, k, outcome).Observe(d.Seconds())
}

// depthCollector reports queue depth by queue and state at scrape time.
type depthCollector struct {
	// pool is the last registered client's: a client made again on the
	// registry (its first pool closed) is scraped through its own pool
	// (TestRegistryOutlivesTheFirstClientsPool).
	pool   atomic.Pointer[pgxpool.Pool]
	schema string
	desc   *prometheus.Desc
	sql    string
	// labels is shared by the clients on the registry.
	labels *labelSet
}

func newDepthCollector(c *Client) *depthCollector {
	jobs := sqlident.Quote(c.cfg.Schema, "jobs")
	d := &depthCollector{
		schema: c.cfg.Schema,
		labels: newLabelSet(),
		desc: prometheus.NewDesc("pgwake_queue_depth",
			"Jobs per queue and state at scrape time: available (pending and due), scheduled (pending, not yet due), failed. Queues this process does not work are summed as queue=\"other\".",
			[]string{"queue", "state"}, nil),
		// Grouped by the label value, so a worked queue named "other" and
		// the others share one series instead of colliding.
		sql: `
SELECT CASE WHEN queue = ANY($1::text[]) THEN queue ELSE $2::text END, state, sum(n)::bigint FROM (
	SELECT queue, CASE WHEN run_after <= now() THEN 'available' ELSE 'scheduled' END AS state, count(*) AS n
	FROM ` + jobs + ` WHERE state = 'pending' GROUP BY 1, 2
	UNION ALL
	SELECT queue, 'failed', count(*) FROM ` + jobs + ` WHERE state = 'failed' GROUP BY 1
) d GROUP BY 1, 2`,
	}
	d.pool.Store(c.pool)
	return d
}

func (d *depthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

func (d *depthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := d.pool.Load().Query(ctx, d.sql, d.labels.queueList(), otherLabel)
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
