package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/pgwake/pgwake/queue"
)

func init() {
	register(command{
		name:    "enqueue",
		summary: "add a job (or, with --batch, many from JSON lines on stdin) and print its id",
		usage: `Usage: pgwake enqueue --kind KIND [--queue Q] [--payload JSON | --payload-file F | -]
                      [--delay D | --run-after TIME] [--priority P] [--max-attempts N]
                      [--unique-key K [--unique-scope kind|queue]
                       [--unique-hold active|pending|succeeded | --unique-period D]]
       pgwake enqueue --batch [defaults as flags] < jobs.jsonl

Enqueues one job and prints its id. The payload is JSON: --payload, a file
(--payload-file, "-" for stdin) or stdin when the last argument is "-";
default {}. With --unique-key, enqueuing while the key is held prints the
holder's id and writes nothing. A key is unique per kind (--unique-scope
queue: per queue) and held while its job is pending or running (--unique-hold
pending: until its first attempt; succeeded: also after it succeeded;
--unique-period D: for D after the enqueue, whatever becomes of the job).
See docs/unique.md.

With --batch, every non-empty line of stdin is one job as a JSON object:
  {"kind":"email","queue":"default","payload":{"to":"a@b.c"},"priority":0,
   "delay":"30s","run_after":"2030-01-01T00:00:00Z","max_attempts":5,"unique_key":"k",
   "unique_scope":"kind","unique_hold":"active","unique_period":"10m"}
Only "kind" is required (or --kind); fields missing from a line take the
flags' values. All lines go in one transaction with one NOTIFY per queue;
ids are printed one per line, in input order.

Examples:
  pgwake enqueue --kind email --payload '{"to":"ann@example.com"}'
  echo '{"n":1}' | pgwake enqueue --kind resize --delay 10s -
  printf '{"kind":"a"}\n{"kind":"b","delay":"1m"}\n' | pgwake enqueue --batch`,
		run: runEnqueue,
	})
}

// batchLine is one job of `enqueue --batch`.
type batchLine struct {
	Kind        *string         `json:"kind"`
	Queue       *string         `json:"queue"`
	Payload     json.RawMessage `json:"payload"`
	Priority    *int            `json:"priority"`
	Delay       *string         `json:"delay"`
	RunAfter    *time.Time      `json:"run_after"`
	MaxAttempts *int            `json:"max_attempts"`
	UniqueKey   *string         `json:"unique_key"`
	UniqueScope *string         `json:"unique_scope"`
	UniqueHold  *string         `json:"unique_hold"`
	// UniquePeriod is a Go duration, e.g. "10m".
	UniquePeriod *string `json:"unique_period"`
}

// enqueueFlags are the parsed flags of enqueue.
type enqueueFlags struct {
	kind, queueName, payload, payloadFile, runAfter *string
	uniqueKey, uniqueScope, uniqueHold              *string
	delay, uniquePer                                *time.Duration
	priority, maxAttempts                           *int
	batch                                           *bool
	stdinPayload                                    bool // "-": the payload is stdin
}

func runEnqueue(ctx context.Context, env *cliEnv, args []string) error {
	f, err := parseEnqueueFlags(env, args)
	if err != nil {
		return err
	}
	base, err := f.baseJob()
	if err != nil {
		return err
	}
	var jobs []queue.NewJob
	var lines []int // --batch: the input line of each job
	if *f.batch {
		jobs, lines, err = f.batchJobs(env, base)
	} else {
		jobs, err = f.oneJob(env, base)
	}
	if err != nil {
		return err
	}
	client, pool, err := env.connectClient(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := client.EnqueueMany(ctx, jobs)
	if err != nil {
		var je *queue.JobError
		if errors.As(err, &je) {
			if *f.batch {
				return fmt.Errorf("line %d: %s: %v; nothing was enqueued", lines[je.Index], je.Field, je.Err)
			}
			return usagef("%s: %v", je.Field, je.Err)
		}
		return explainSchemaError(err, env.schema)
	}
	return printEnqueued(env, res)
}

// parseEnqueueFlags parses enqueue's flags and its one optional argument,
// "-" (the payload is stdin).
func parseEnqueueFlags(env *cliEnv, args []string) (enqueueFlags, error) {
	fs := env.flags()
	f := enqueueFlags{
		kind:        fs.String("kind", "", "job kind, selects the handler (required unless every --batch line has one)"),
		queueName:   fs.String("queue", queue.DefaultQueue, "queue name"),
		payload:     fs.String("payload", "", "payload as JSON text (default {})"),
		payloadFile: fs.String("payload-file", "", "read the payload from this file (\"-\": stdin)"),
		delay:       fs.Duration("delay", 0, "run the job this long from now, e.g. 30s, 5m"),
		runAfter:    fs.String("run-after", "", "run the job at this time (RFC 3339, e.g. 2030-01-02T15:04:05Z)"),
		priority:    fs.Int("priority", 0, "lower runs first, -32768..32767"),
		maxAttempts: fs.Int("max-attempts", 5, "attempts before the job is marked failed"),
		uniqueKey:   fs.String("unique-key", "", "deduplicate: while a job holds this key, return its id instead"),
		uniqueScope: fs.String("unique-scope", "", "what the unique key is unique within: kind (default) or queue"),
		uniqueHold:  fs.String("unique-hold", "", "which jobs hold the key: active (pending or running, default), pending (until its first attempt) or succeeded (also after success)"),
		uniquePer:   fs.Duration("unique-period", 0, "hold the key for this long after the enqueue, whatever becomes of the job (debounce), e.g. 10m"),
		batch:       fs.Bool("batch", false, "read many jobs as JSON lines from stdin"),
	}
	if err := env.parse(fs, args); err != nil {
		return f, err
	}
	switch {
	case fs.NArg() == 1 && fs.Arg(0) == "-":
		f.stdinPayload = true
	case fs.NArg() > 0:
		return f, usagef("unexpected argument %q; give the payload with --payload, --payload-file or - (stdin)", fs.Arg(0))
	}
	return f, nil
}

// baseJob is the job the flags describe, without its payload: every job of
// a batch starts from it.
func (f enqueueFlags) baseJob() (queue.NewJob, error) {
	var at time.Time
	if *f.runAfter != "" {
		t, err := time.Parse(time.RFC3339Nano, *f.runAfter)
		if err != nil {
			return queue.NewJob{}, usagef("--run-after %q is not an RFC 3339 time like 2030-01-02T15:04:05Z", *f.runAfter)
		}
		at = t
		if *f.delay != 0 {
			return queue.NewJob{}, usagef("give --delay or --run-after, not both")
		}
	}
	if *f.delay < 0 {
		return queue.NewJob{}, usagef("--delay %s is negative", *f.delay)
	}
	if *f.maxAttempts < 1 {
		// 0 would mean the client's default in queue.NewJob.
		return queue.NewJob{}, usagef("--max-attempts %d: max attempts must be at least 1", *f.maxAttempts)
	}
	return queue.NewJob{Queue: *f.queueName, Kind: *f.kind, Priority: *f.priority, Delay: *f.delay,
		RunAfter: at, MaxAttempts: *f.maxAttempts, UniqueKey: *f.uniqueKey,
		UniqueScope: queue.UniqueScope(*f.uniqueScope), UniqueHold: queue.UniqueHold(*f.uniqueHold), UniquePeriod: *f.uniquePer}, nil
}

// batchJobs reads --batch's JSON lines from stdin.
func (f enqueueFlags) batchJobs(env *cliEnv, base queue.NewJob) ([]queue.NewJob, []int, error) {
	if *f.payload != "" || *f.payloadFile != "" || f.stdinPayload {
		return nil, nil, usagef("--batch reads jobs from stdin; give payloads in the lines, not with --payload, --payload-file or -")
	}
	jobs, lines, err := readBatch(env.stdin, base)
	if err != nil {
		return nil, nil, err
	}
	if len(jobs) == 0 {
		return nil, nil, usagef("--batch: stdin has no jobs")
	}
	return jobs, lines, nil
}

// oneJob is base with the payload given one way: --payload, --payload-file
// or stdin.
func (f enqueueFlags) oneJob(env *cliEnv, base queue.NewJob) ([]queue.NewJob, error) {
	if *f.kind == "" {
		return nil, usagef("--kind is required")
	}
	n := 0
	for _, set := range []bool{*f.payload != "", *f.payloadFile != "", f.stdinPayload} {
		if set {
			n++
		}
	}
	if n > 1 {
		return nil, usagef("give the payload one way: --payload, --payload-file or -")
	}
	var body []byte
	switch {
	case *f.payload != "":
		body = []byte(*f.payload)
	case *f.payloadFile == "-" || f.stdinPayload:
		b, err := io.ReadAll(env.stdin)
		if err != nil {
			return nil, fmt.Errorf("read payload from stdin: %w", err)
		}
		body = b
	case *f.payloadFile != "":
		b, err := os.ReadFile(*f.payloadFile)
		if err != nil {
			return nil, fmt.Errorf("read --payload-file: %w", err)
		}
		body = b
	}
	body = bytes.TrimSpace(body)
	if len(body) > 0 && !json.Valid(body) {
		return nil, usagef("the payload is not valid JSON (%d bytes); quote it for the shell, e.g. --payload '{\"id\":1}'", len(body))
	}
	j := base
	if len(body) > 0 {
		j.Payload = json.RawMessage(body)
	}
	return []queue.NewJob{j}, nil
}

// printEnqueued prints each job's id on stdout (a duplicate's: the
// holder's) and says on stderr which unique keys were held.
func printEnqueued(env *cliEnv, res []queue.EnqueueResult) error {
	w := bufio.NewWriter(env.stdout)
	dups := 0
	for _, r := range res {
		fmt.Fprintln(w, r.ID)
		if r.Duplicate {
			dups++
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if dups > 0 {
		fmt.Fprintf(env.stderr, "pgwake enqueue: %d of %d jobs' unique keys were held; printed the holder's id, wrote nothing for them\n", dups, len(res))
		for i, r := range res {
			if r.Duplicate && !r.HeldUntil.IsZero() {
				fmt.Fprintf(env.stderr, "pgwake enqueue: job %d: key held by job %d until %s\n", i, r.ID, r.HeldUntil.UTC().Format(time.RFC3339))
			}
		}
	}
	return nil
}

// readBatch parses JSON lines into jobs, filling missing fields from base,
// and returns each job's line number (blank lines are skipped).
func readBatch(r io.Reader, base queue.NewJob) ([]queue.NewJob, []int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 8<<20)
	var jobs []queue.NewJob
	var lines []int
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var l batchLine
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return nil, nil, usagef("--batch line %d: %v; each line must be one JSON object like {\"kind\":\"email\",\"payload\":{}}", line, err)
		}
		j := base
		j.Payload = nil
		if l.Kind != nil {
			j.Kind = *l.Kind
		}
		if j.Kind == "" {
			return nil, nil, usagef("--batch line %d: no \"kind\" and no --kind", line)
		}
		if l.Queue != nil {
			j.Queue = *l.Queue
		}
		if len(l.Payload) > 0 && string(l.Payload) != "null" {
			j.Payload = l.Payload
		}
		if l.Priority != nil {
			j.Priority = *l.Priority
		}
		if l.Delay != nil {
			d, err := time.ParseDuration(*l.Delay)
			if err != nil || d < 0 {
				return nil, nil, usagef("--batch line %d: delay %q is not a duration like \"30s\"", line, *l.Delay)
			}
			j.Delay, j.RunAfter = d, time.Time{}
		}
		if l.RunAfter != nil {
			j.RunAfter = *l.RunAfter
		}
		if l.MaxAttempts != nil {
			if *l.MaxAttempts < 1 {
				return nil, nil, usagef("--batch line %d: max_attempts %d: max attempts must be at least 1", line, *l.MaxAttempts)
			}
			j.MaxAttempts = *l.MaxAttempts
		}
		if l.UniqueKey != nil {
			j.UniqueKey = *l.UniqueKey
		}
		if l.UniqueScope != nil {
			j.UniqueScope = queue.UniqueScope(*l.UniqueScope)
		}
		if l.UniqueHold != nil {
			j.UniqueHold = queue.UniqueHold(*l.UniqueHold)
		}
		if l.UniquePeriod != nil {
			d, err := time.ParseDuration(*l.UniquePeriod)
			if err != nil || d <= 0 {
				return nil, nil, usagef("--batch line %d: unique_period %q is not a positive duration like \"10m\"", line, *l.UniquePeriod)
			}
			j.UniquePeriod = d
		}
		jobs, lines = append(jobs, j), append(lines, line)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read --batch input: %w", err)
	}
	return jobs, lines, nil
}
