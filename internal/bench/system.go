package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Mode names a benchmark mode.
type Mode string

// The modes, in the order Run runs them.
const (
	ModeDrain   Mode = "drain"
	ModeLatency Mode = "latency"
	ModeIdle    Mode = "idle"
	ModeDelayed Mode = "delayed"
	ModeEnqueue Mode = "enqueue"
	ModeScale   Mode = "scale"
	// ModeConcurrent: many jobs that wait on something else, on a small
	// pool (systems whose handlers hold no connection while they run).
	ModeConcurrent Mode = "concurrent"
	// ModeStream drains jobs while the event stream forwards to NATS
	// JetStream. It runs only when named (it needs a NATS server) and only
	// for pgwake, through Options.Stream.
	ModeStream Mode = "stream"
	// ModeScheduled is the latency mode with no backlog and with jobs
	// scheduled ahead in the same queue.
	ModeScheduled Mode = "scheduled"
	// ModeHousekeeping times retention and event pruning batches with few
	// and with many rows kept (systems that implement Housekeeper).
	ModeHousekeeping Mode = "housekeeping"
	// ModeQueues enqueues one batch of jobs, each in a queue of its own, in
	// one call (systems that implement QueueSpreader), beside the same rows
	// in one plain INSERT.
	ModeQueues Mode = "queues"
)

// AllModes lists every mode "all" means, in run order.
var AllModes = []Mode{ModeDrain, ModeLatency, ModeIdle, ModeDelayed, ModeEnqueue, ModeScale, ModeScheduled, ModeHousekeeping, ModeQueues, ModeConcurrent}

// OptInModes run only when named, after AllModes.
var OptInModes = []Mode{ModeStream}

// ErrUnknownMode is wrapped by ParseModes for a name that is not a mode.
var ErrUnknownMode = errors.New("unknown bench mode")

// ParseModes turns a comma-separated list ("drain,latency", or "all") into
// modes, in run order, without repeats.
func ParseModes(list string) ([]Mode, error) {
	want := map[Mode]bool{}
	for _, f := range splitList(list) {
		if f == "all" {
			for _, m := range AllModes {
				want[m] = true
			}
			continue
		}
		m := Mode(f)
		if !m.valid() {
			return nil, fmt.Errorf("%w %q; use a comma-separated list of %s, or all", ErrUnknownMode, f, modeNames())
		}
		want[m] = true
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("%w: empty list; use a comma-separated list of %s, or all", ErrUnknownMode, modeNames())
	}
	var out []Mode
	for _, m := range append(AllModes[:len(AllModes):len(AllModes)], OptInModes...) {
		if want[m] {
			out = append(out, m)
		}
	}
	return out, nil
}

func (m Mode) valid() bool {
	for _, k := range append(AllModes[:len(AllModes):len(AllModes)], OptInModes...) {
		if m == k {
			return true
		}
	}
	return false
}

func modeNames() string {
	s := ""
	for i, m := range append(AllModes[:len(AllModes):len(AllModes)], OptInModes...) {
		if i > 0 {
			s += ", "
		}
		s += string(m)
	}
	return s
}

// Job is one benchmark job: a sequence number, unique within a mode run,
// that the handler reports back, and an optional start time.
type Job struct {
	// Seq identifies the job within one mode run: 0..n-1.
	Seq int64
	// RunAt, when not zero, is the time the job becomes due (delayed mode).
	RunAt time.Time
	// Sleep is how long its handler sleeps after reporting the job
	// (concurrent mode).
	Sleep time.Duration
}

// Payload is the job's arguments as JSON: {"seq":N}, plus "sleep_ms" when its
// handler sleeps. Systems that carry a payload store this, hand its decoded
// Seq to the handler callback, then sleep SleepMS.
type Payload struct {
	Seq     int64 `json:"seq"`
	SleepMS int64 `json:"sleep_ms,omitempty"`
}

// EncodePayload returns job's payload JSON.
func EncodePayload(job Job) []byte {
	b, _ := json.Marshal(Payload{Seq: job.Seq, SleepMS: job.Sleep.Milliseconds()}) // cannot fail
	return b
}

// DecodePayload returns the Seq of a payload made by EncodePayload.
func DecodePayload(b []byte) (int64, error) {
	var p Payload
	if err := json.Unmarshal(b, &p); err != nil {
		return 0, fmt.Errorf("bench: decode payload: %w", err)
	}
	return p.Seq, nil
}

// Env is what a System runs on.
type Env struct {
	// Pool is shared by the bench and the system under test. Its MaxConns is
	// at least Workers + the larger of Producers and LatencyProducers + 8.
	Pool *pgxpool.Pool
	// Workers is how many jobs the system may run at once (its worker or
	// concurrency setting).
	Workers int
	// Logf receives progress lines (to stderr).
	Logf func(format string, args ...any)
	// LeaseDuration, when not zero, is a leasing system's lease (pgwake
	// extends its leases every third of it); systems without leases ignore
	// it. Set by the concurrent mode (Sizes.ConcurrentLease).
	LeaseDuration time.Duration
}

// HandleFunc is called by a system's handler as its first action, with the
// job's Seq. It is safe for concurrent use.
type HandleFunc func(seq int64)

// System is a job queue under test. Run calls, for every mode run: Setup,
// then InsertMany/Enqueue/Start as the mode needs, then Teardown. Calls are
// sequential except Enqueue, which producers call concurrently.
type System interface {
	// Name identifies the system and its configuration in results
	// ("pgwake", "river-tuned").
	Name() string
	// Config describes the configuration in one line, for the report.
	Config() string
	// Supports reports whether the system takes part in mode.
	Supports(mode Mode) bool
	// Setup prepares a fresh, empty queue (its own schema or tables).
	Setup(ctx context.Context, env *Env) error
	// InsertMany inserts jobs in bulk, the system's fastest path.
	InsertMany(ctx context.Context, jobs []Job) error
	// Enqueue inserts one job in its own transaction and returns after the
	// commit.
	Enqueue(ctx context.Context, job Job) error
	// Start starts workers that call handle at the start of every handler;
	// stop ends them and waits until they have ended.
	Start(ctx context.Context, handle HandleFunc) (stop func() error, err error)
	// Teardown removes what Setup made.
	Teardown(ctx context.Context) error
}

// Counter is implemented by systems that can count their unfinished jobs.
// Drain waits for zero (so the time includes the last completion's commit)
// and enqueue compares the count with the acknowledged enqueues.
type Counter interface {
	Unfinished(ctx context.Context) (int64, error)
}

// Finisher is implemented by systems that can fill their table with n
// finished jobs, for the scale mode.
type Finisher interface {
	InsertFinished(ctx context.Context, n int) error
}

// FailedKeeper is implemented by systems that can fill their table with n
// failed jobs still inside retention's window (finished 1 to 6 days ago,
// each with its events), for the scheduled mode's third case.
type FailedKeeper interface {
	InsertFailed(ctx context.Context, n int) error
}

// Diagnoser is implemented by systems that can explain a run: counters such
// as pgwake's claims by source. Diagnostics is called after the workers of
// a mode run have stopped; its figures join the result's extras.
type Diagnoser interface {
	Diagnostics() map[string]float64
}

// Settler is a system that can bring its tables to a steady state after a
// bulk insert (vacuum, statistics), before a measurement.
type Settler interface {
	Settle(ctx context.Context) error
}

// Housekeeper is a system whose housekeeping the housekeeping mode times.
type Housekeeper interface {
	// Housekeep fills the system's fresh tables with kept finished jobs and
	// kept events, and expired ones of each, then deletes what expired and
	// returns the time of each.
	Housekeep(ctx context.Context, kept, expired int) (Housekeeping, error)
}

// QueueSpreader is a system whose one-call bulk enqueue over many distinct
// queues the queues mode times.
type QueueSpreader interface {
	// EnqueueSpread enqueues n jobs in one call (one statement where the
	// system can), job i in a queue named for i, and returns how many jobs
	// the system's tables hold afterwards.
	EnqueueSpread(ctx context.Context, n int) (int64, error)
}

// Housekeeping is what one Housekeep call measured.
type Housekeeping struct {
	// RetentionBatches and PruneBatches are how many statements each
	// deletion took; Retention and Prune their total times.
	RetentionBatches, PruneBatches int
	Retention, Prune               time.Duration
	// JobsDeleted and EventsDeleted should equal the expired count.
	JobsDeleted, EventsDeleted int64
}
