package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// The Go client refuses before writing anything exactly the payloads that
// PostgreSQL's jsonb refuses, at the edges json.Valid does not see: lone
// UTF-16 surrogates, \u0000, and numbers beyond numeric's 131072 digits
// before the point and 16383 after it. Each payload's fate is checked
// against the server's own cast, so the two cannot drift apart unnoticed.
func TestPayloadCheckAgreesWithJsonb(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	payloads := []string{
		`{"a":"\ud83d\ude00"}`, // a pair: accepted
		`{"a":"\ud800"}`, `{"a":"\udc00x"}`, `{"a":"\ud800\u0041"}`, `["\ud800"]`, `{"\ud800":1}`,
		`{"a":"\\ud800"}`, `{"a":"\\u0000"}`, `{"a":"\u0000"}`, `{"a":"\u0001"}`,
		`1e131071`, `1e131072`, `9.9e131071`, `0.5e131072`, `0.5e131073`, `0.0001e131075`, `0.0001e131076`,
		`1e-16383`, `1e-16384`, `1.5e-16382`, `1.5e-16383`, `0e999999`, `0e1073741822`, `0e1073741823`, `-1e1073741823`,
		`{"a":1e1000000}`, `{"n":-12.500e2}`, `[` + strings.Repeat("1", 131073) + `]`,
		`0.` + strings.Repeat("0", 16383), `0.` + strings.Repeat("0", 16384),
	}
	accepted := 0
	for _, p := range payloads {
		short := p
		if len(short) > 40 {
			short = short[:40] + "..."
		}
		_, castErr := e.pool.Exec(ctx, `SELECT $1::text::jsonb`, p)
		_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Payload: json.RawMessage(p)})
		if castErr != nil {
			require.ErrorIs(t, err, queue.ErrInvalidPayload, "%s: jsonb refuses it (%v)", short, castErr)
			var je *queue.JobError
			require.ErrorAs(t, err, &je, short)
			require.Equal(t, "payload", je.Field, short)
		} else {
			require.NoError(t, err, "%s: jsonb takes it", short)
			accepted++
		}
	}
	require.Greater(t, accepted, 10)
	require.Equal(t, accepted, e.count(`true`), "the accepted payloads were written, nothing of the refused ones")
}

// Metadata that is not an object of strings (written before migration
// 0022 through the SQL API, which took any jsonb, or through enqueue_one,
// which does not check it) reaches the handler and the read API alike:
// strings as they are, other values as their JSON text, and metadata that
// is not an object as nil. Since 0022 the SQL API's enqueue and
// enqueue_many refuse such metadata (PW012) and write nothing.
func TestMetadataWrittenThroughSQL(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	got := map[int64]map[string]string{}
	h := queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, j *queue.Job) error {
		mu.Lock()
		defer mu.Unlock()
		got[j.ID] = j.Metadata
		return nil
	})
	e := newEnv(t, queue.Config{Handlers: map[string]queue.Handler{"k": h}, Queues: map[string]queue.QueueConfig{"default": {}}})
	ctx := context.Background()
	cases := []struct {
		metadata string
		want     map[string]string
	}{
		{`{"traceparent":"00-abc","retries":3,"ok":true,"none":null,"list":[1,"x"]}`,
			map[string]string{"traceparent": "00-abc", "retries": "3", "ok": "true", "none": "", "list": `[1, "x"]`}},
		{`{"tenant":"7"}`, map[string]string{"tenant": "7"}},
		{`[1,2]`, nil},
		{`"str"`, nil},
		{`5`, nil},
	}
	ids := make([]int64, len(cases))
	for _, tc := range cases {
		_, err := e.pool.Exec(ctx, `SELECT `+e.table("enqueue")+`('k', metadata => $1::jsonb)`, tc.metadata)
		if tc.metadata != `{"tenant":"7"}` {
			var pe *pgconn.PgError
			require.ErrorAs(t, err, &pe, tc.metadata)
			require.Equal(t, "PW012", pe.Code, tc.metadata)
			require.Equal(t, "metadata", pe.ColumnName, tc.metadata)
			_, err = e.pool.Exec(ctx, `SELECT `+e.table("enqueue_many")+`(jsonb_build_array(jsonb_build_object('kind', 'k'), jsonb_build_object('kind', 'k', 'metadata', $1::jsonb)))`, tc.metadata)
			require.ErrorAs(t, err, &pe, tc.metadata)
			require.Equal(t, "PW012", pe.Code, tc.metadata)
			require.Contains(t, pe.Message, "job 1: metadata", tc.metadata)
			require.Equal(t, 0, e.count(`true`), "nothing written")
		} else {
			require.NoError(t, err)
			_, err = e.pool.Exec(ctx, `DELETE FROM `+e.table("jobs"))
			require.NoError(t, err)
		}
	}
	for i, tc := range cases {
		// As an older pgwake let the SQL API write it.
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT `+e.table("enqueue_one")+`('k')`).Scan(&ids[i]))
		_, err := e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET metadata = $2::jsonb WHERE id = $1`, ids[i], tc.metadata)
		require.NoError(t, err)
	}
	// JSON null is no metadata, in both calls.
	_, err := e.pool.Exec(ctx, `SELECT `+e.table("enqueue")+`('k', metadata => 'null')`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `SELECT `+e.table("enqueue_many")+`('[{"kind":"k","metadata":null,"payload":null}]')`)
	require.NoError(t, err)
	require.Equal(t, 2, e.count(`metadata IS NULL AND payload = '{}'`), "JSON null metadata and payload take the defaults")
	var nulls []int64
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM `+e.table("jobs")+` WHERE metadata IS NULL`).Scan(&nulls))
	for range nulls {
		cases = append(cases, cases[len(cases)-1])
		cases[len(cases)-1].metadata, cases[len(cases)-1].want = "null", nil
	}
	ids = append(ids, nulls...)
	e.run()
	waitFor(t, 10*time.Second, "the jobs ran", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == len(cases)
	})
	for i, tc := range cases {
		mu.Lock()
		seen := got[ids[i]]
		mu.Unlock()
		require.Equal(t, tc.want, seen, "the handler's metadata for %s", tc.metadata)
		info, err := e.c.JobGet(ctx, ids[i])
		require.NoError(t, err)
		require.Equal(t, tc.want, info.Metadata, "JobGet's metadata for %s", tc.metadata)
	}
}

// A producer deployed before its schema was migrated (or pointed at the
// wrong schema) gets ErrSchemaNotMigrated from Enqueue and the read API,
// not a raw "function does not exist".
func TestEnqueueOnAnOlderSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `DROP FUNCTION `+e.table("enqueue_one")+`(text, jsonb, text, timestamptz, interval, integer, integer, jsonb, integer)`)
	require.NoError(t, err)
	_, err = e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.ErrorIs(t, err, queue.ErrSchemaNotMigrated)
	require.Contains(t, err.Error(), "enqueue_one", "the error names what is missing")

	missing, err := queue.New(e.pool, queue.Config{Schema: pgtest.SchemaOn(t, e.pool)})
	require.NoError(t, err)
	for name, call := range map[string]func() error{
		"Enqueue":           func() error { _, err := missing.Enqueue(ctx, queue.NewJob{Kind: "k"}); return err },
		"EnqueueMany":       func() error { _, err := missing.EnqueueMany(ctx, []queue.NewJob{{Kind: "k"}, {Kind: "k"}}); return err },
		"JobGet":            func() error { _, err := missing.JobGet(ctx, 1); return err },
		"QueueStats":        func() error { _, err := missing.QueueStats(ctx, queue.QueueStatsParams{}); return err },
		"JobList":           func() error { _, err := missing.JobList(ctx, queue.JobListParams{}); return err },
		"JobEvents":         func() error { _, err := missing.JobEvents(ctx, 1); return err },
		"EventsAfter":       func() error { _, err := missing.EventsAfter(ctx, 0, 10); return err },
		"LastEventID":       func() error { _, err := missing.LastEventID(ctx); return err },
		"Queues":            func() error { _, err := missing.Queues(ctx); return err },
		"PeriodicSchedules": func() error { _, err := missing.PeriodicSchedules(ctx); return err },
	} {
		err := call()
		require.True(t, errors.Is(err, queue.ErrSchemaNotMigrated), "%s: %v", name, err)
	}
}

// Read API inputs a caller gets wrong: math.MaxInt as "no limit" for
// QueueStats (its count of one past the limit overflowed into an encode
// error), and invalid UTF-8 in a JobList filter (a raw SQL error, where a
// *FilterError before any SQL is promised).
func TestReadFiltersMisused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	e.enqueueIDs(queue.NewJob{Kind: "k"})
	st, err := e.c.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: math.MaxInt})
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.EqualValues(t, 1, st[0].Pending)
	for _, p := range []queue.JobListParams{{Queue: "a\xff"}, {Kind: "\xfe"}, {ErrorContains: "x\xc3"}} {
		_, err := e.c.JobList(ctx, p)
		var fe *queue.FilterError
		require.ErrorAs(t, err, &fe, "%+v", p)
		require.Contains(t, fe.Reason, "UTF-8")
	}
}
