package pgwaketest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// EnvURL names the variable that points the tests at an existing server
// instead of a throwaway cluster.
const EnvURL = pgtest.EnvURL

// DrainLimit bounds the jobs one Drain runs, so that a job that keeps
// enqueuing itself fails the test instead of hanging it.
const DrainLimit = 10000

// timeout bounds each statement of the helpers.
const timeout = 30 * time.Second

// Main is meant to be TestMain: it gets a database ($TEST_DATABASE_URL, or
// a throwaway cluster), runs the tests, removes what it started and exits
// with the tests' code.
func Main(m *testing.M) { pgtest.Main(m) }

// Pool returns the test binary's shared pool on Main's database. Do not
// close it.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pgtest.Pool(t)
}

// Schema creates a fresh schema on pool's server, migrates it, and drops it
// at t's cleanup. It returns the schema's name.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	schema := pgtest.SchemaOn(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := migrations.Up(ctx, pool, schema); err != nil {
		t.Fatalf("pgwaketest: migrate schema %s: %v", schema, err)
	}
	return schema
}

// NewClient returns a client on a fresh Schema with cfg (cfg.Schema is
// replaced; a nil cfg.Registerer gets a registry of its own, so tests do
// not collide on metric names). The client is not running: work its jobs
// with WorkOne and Drain, or start it yourself.
func NewClient(t testing.TB, pool *pgxpool.Pool, cfg queue.Config) *queue.Client {
	t.Helper()
	cfg.Schema = Schema(t, pool)
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	c, err := queue.New(pool, cfg)
	if err != nil {
		t.Fatalf("pgwaketest: new client: %v", err)
	}
	return c
}

// RequireEnqueued fails t unless c's schema has a job of kind whose payload
// contains payload (JSON containment, as jsonb's @>: every key given must
// match, others may be there; nil matches any payload), in any state. It
// returns the newest such job's id. The failure message lists the jobs of
// that kind it found instead.
func RequireEnqueued(t testing.TB, c *queue.Client, kind string, payload any) int64 {
	t.Helper()
	return requireEnqueued(t, c.JobList, kind, payload)
}

// RequireEnqueuedTx is RequireEnqueued inside tx, which sees the jobs tx
// enqueued before it commits.
func RequireEnqueuedTx(t testing.TB, c *queue.Client, tx pgx.Tx, kind string, payload any) int64 {
	t.Helper()
	return requireEnqueued(t, func(ctx context.Context, p queue.JobListParams) (queue.JobListPage, error) {
		return c.JobListTx(ctx, tx, p)
	}, kind, payload)
}

// listed bounds the other jobs a failure message shows.
const listed = 5

// jobLister is Client.JobList, or JobListTx in a transaction.
type jobLister func(context.Context, queue.JobListParams) (queue.JobListPage, error)

func requireEnqueued(t testing.TB, list jobLister, kind string, payload any) int64 {
	t.Helper()
	want := json.RawMessage("{}")
	switch p := payload.(type) {
	case nil:
	case json.RawMessage:
		want = p
	case []byte: // JSON text, as queue.NewJob.Payload takes it
		want = p
	case string:
		t.Fatalf("pgwaketest: RequireEnqueued: payload: a Go string; pass json.RawMessage for JSON text or a value to encode (as queue.NewJob.Payload)")
		return 0
	default:
		b, err := json.Marshal(payload)
		if err != nil {
			t.Fatalf("pgwaketest: RequireEnqueued: payload: %v", err)
			return 0
		}
		want = b
	}
	if len(want) == 0 { // empty JSON text: {}, as queue.NewJob.Payload takes it
		want = json.RawMessage("{}")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	match, err := list(ctx, queue.JobListParams{Kind: kind, PayloadContains: want, Limit: 1})
	if err != nil {
		t.Fatalf("pgwaketest: RequireEnqueued: %v", err)
		return 0
	}
	if len(match.Jobs) == 1 {
		return match.Jobs[0].ID
	}
	newest, err := list(ctx, queue.JobListParams{Kind: kind, WithPayload: true, Limit: listed})
	if err != nil {
		t.Fatalf("pgwaketest: RequireEnqueued: %v", err)
		return 0
	}
	var others []string
	for _, j := range newest.Jobs {
		others = append(others, fmt.Sprintf("  job %d (%s): %s", j.ID, j.State, j.Payload))
	}
	msg := fmt.Sprintf("pgwaketest: no job of kind %q with a payload containing %s was enqueued", kind, want)
	if len(others) == 0 {
		msg += fmt.Sprintf("; there is no job of kind %q", kind)
	} else {
		msg += fmt.Sprintf("; the newest jobs of kind %q:\n%s", kind, strings.Join(others, "\n"))
	}
	t.Fatalf("%s", msg)
	return 0
}

// RequireState fails t unless job id is in state.
func RequireState(t testing.TB, c *queue.Client, id int64, state queue.JobState) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	j, err := c.JobGet(ctx, id)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		t.Fatalf("pgwaketest: job %d does not exist", id)
	case err != nil:
		t.Fatalf("pgwaketest: RequireState: %v", err)
	case j.State != state && j.LastError != "":
		t.Fatalf("pgwaketest: job %d is %s, want %s (last error: %s)", id, j.State, state, j.LastError)
	case j.State != state:
		t.Fatalf("pgwaketest: job %d is %s, want %s", id, j.State, state)
	}
}

// WorkOne runs one due job of c's queues through its handler (see
// queue.Client.WorkOne) and returns its id; ok is false when no job was due.
func WorkOne(t testing.TB, c *queue.Client) (id int64, ok bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	id, ok, err := c.WorkOne(ctx)
	if err != nil {
		t.Fatalf("pgwaketest: WorkOne: %v", err)
	}
	return id, ok
}

// Drain runs due jobs with WorkOne until none is due, including jobs the
// handlers enqueue and retries that are due at once, and returns the ids it
// ran in order. Jobs scheduled for later (a delay, a retry's backoff) stay.
// It fails t after DrainLimit jobs.
func Drain(t testing.TB, c *queue.Client) []int64 {
	t.Helper()
	var ran []int64
	for {
		id, ok := WorkOne(t, c)
		if !ok {
			return ran
		}
		ran = append(ran, id)
		if len(ran) >= DrainLimit {
			t.Fatalf("pgwaketest: Drain ran %d jobs and more are due: does a job keep enqueuing itself?", len(ran))
			return ran
		}
	}
}
