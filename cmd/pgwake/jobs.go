package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgwake/pgwake/internal/termsafe"
	"github.com/pgwake/pgwake/queue"
)

func init() {
	register(command{
		name:    "jobs",
		summary: "list, show, retry, cancel or prune jobs",
		usage: `Usage: pgwake jobs list [--queue Q] [--kind K] [--state S] [--error TEXT]
           [--created-after T] [--created-before T] [--before ID] [--limit N] [--json]
       pgwake jobs show ID [--json]
       pgwake jobs retry (ID... | --all-failed [--queue Q] [--kind K])
       pgwake jobs cancel ID...
       pgwake jobs prune [--succeeded 24h] [--cancelled 24h] [--failed 168h]

list    jobs, newest first, filtered by queue, kind, state (pending,
        running, succeeded, failed, cancelled), text in the last error and
        creation time; --limit defaults to 50. After a full page it prints
        the --before that reads the next one (pages stay stable while jobs
        are enqueued). Each job shows its unique key with the key's scope
        and hold, and its metadata (e.g. a trace context).
show    one job with its payload, unique key (scope, hold; for a period,
        when it ends), metadata and full event history (of a job deleted by
        retention, the history alone).
retry   puts failed jobs back to pending, due now (a "retried" event each);
        their attempts are kept and max attempts grows if needed so they run
        at least once more. A job whose unique key another job holds now is
        reported and skipped; the others are retried (exit status 1).
cancel  marks pending jobs cancelled (a "cancelled" event each). A job whose
        handler is running now is cancelled when that attempt ends, if it is
        still pending then; cancel waits for that.
prune   deletes finished jobs that finished longer ago than their state's
        period (negative: keep that state). Workers do this every minute
        with the same defaults; their events stay until "pgwake events prune".

Examples:
  pgwake jobs list --state failed --queue email --error timeout
  pgwake jobs list --state failed --before 1200
  pgwake jobs show 42
  pgwake jobs retry --all-failed --kind email
  pgwake jobs cancel 43 44
  pgwake jobs prune --succeeded 1h --failed=-1s`,
		run: runJobs,
	})
}

func runJobs(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			env.printHelp(env.flags())
			return errHelp
		}
		return usagef("expected an action: list, show, retry, cancel or prune")
	}
	action, rest := args[0], args[1:]
	switch action {
	case "list":
		return jobsList(ctx, env, rest)
	case "show":
		return jobsShow(ctx, env, rest)
	case "retry":
		return jobsChange(ctx, env, rest, true)
	case "cancel":
		return jobsChange(ctx, env, rest, false)
	case "prune":
		return jobsPrune(ctx, env, rest)
	}
	return usagef("unknown action %q: use list, show, retry, cancel or prune", action)
}

// jobRow is a job as list and show print it: the read API's job, and for
// show its event history.
type jobRow struct {
	queue.JobInfo
	Events []eventRow `json:"events,omitempty"`
}

// deletedJob is what show prints for a job whose row retention deleted.
type deletedJob struct {
	ID      int64      `json:"id"`
	Queue   string     `json:"queue"`
	Kind    string     `json:"kind"`
	Deleted bool       `json:"deleted"`
	Events  []eventRow `json:"events"`
}

type eventRow struct {
	ID      int64           `json:"id"`
	Queue   string          `json:"-"`
	Kind    string          `json:"-"`
	Type    string          `json:"type"`
	Attempt int             `json:"attempt"`
	At      time.Time       `json:"at"`
	Data    json.RawMessage `json:"data,omitempty"`
}

var validStates = func() []string {
	var out []string
	for _, s := range queue.States() {
		out = append(out, string(s))
	}
	return out
}()

// timeFlag is an optional RFC 3339 time flag.
type timeFlag struct{ t time.Time }

func (f *timeFlag) String() string {
	if f.t.IsZero() {
		return ""
	}
	return f.t.Format(time.RFC3339)
}

func (f *timeFlag) Set(v string) error {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return fmt.Errorf("want an RFC 3339 time such as 2026-01-02T15:04:05Z")
	}
	f.t = t
	return nil
}

func jobsList(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	q := fs.String("queue", "", "only this queue")
	kind := fs.String("kind", "", "only this kind")
	state := fs.String("state", "", "only this state: pending, running, succeeded, failed, cancelled")
	errText := fs.String("error", "", "only jobs whose last error contains this text (case ignored)")
	var after, before timeFlag
	fs.Var(&after, "created-after", "only jobs created at or after this time (RFC 3339)")
	fs.Var(&before, "created-before", "only jobs created before this time (RFC 3339)")
	cursor := fs.Int64("before", 0, "only jobs with an id below this (the next page's cursor, printed after a full page)")
	limit := fs.Int("limit", 50, "at most this many jobs, newest first")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	if *state != "" && !contains(validStates, *state) {
		return usagef("--state %q: use one of %s", *state, strings.Join(validStates, ", "))
	}
	if *limit < 1 || *limit > queue.MaxJobListLimit {
		return usagef("--limit must be 1 to %d", queue.MaxJobListLimit)
	}
	params := queue.JobListParams{State: queue.JobState(*state), Queue: *q, Kind: *kind, ErrorContains: *errText,
		CreatedAfter: after.t, CreatedBefore: before.t, Before: *cursor, Limit: *limit}
	client, pool, err := env.connectClient(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	page, err := client.JobList(ctx, params)
	var fe *queue.FilterError
	if errors.As(err, &fe) {
		return usagef("%s", fe.Error())
	}
	if err != nil {
		return explainSchemaError(fmt.Errorf("list jobs: %w", err), env.schema)
	}
	list := make([]jobRow, 0, len(page.Jobs))
	for _, j := range page.Jobs {
		list = append(list, jobRow{JobInfo: j})
	}
	if *asJSON {
		enc := json.NewEncoder(termsafe.JSON(env.stdout))
		enc.SetIndent("", "  ")
		return enc.Encode(list)
	}
	if len(list) == 0 {
		fmt.Fprintln(env.stdout, "no jobs match")
		return nil
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tQUEUE\tKIND\tSTATE\tATTEMPTS\tRUN AFTER\tUNIQUE\tMETADATA\tLAST ERROR")
	for _, j := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", j.ID, termsafe.Text(j.Queue, false), termsafe.Text(j.Kind, false),
			termsafe.Text(string(j.State), false), j.Attempts, j.MaxAttempts,
			j.RunAfter.Local().Format("2006-01-02 15:04:05"), orDash(shorten(uniqueText(j.JobInfo), 40)),
			orDash(shorten(metadataText(j.Metadata, " "), 40)), termsafe.Text(shorten(j.LastError, 60), false))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != 0 {
		fmt.Fprintf(env.stdout, "more: add --before %d\n", page.Next)
	}
	return nil
}

func jobsShow(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	asJSON := fs.Bool("json", false, "print one JSON document")
	if err := env.parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("expected one job id")
	}
	id, err := parseID(fs.Arg(0))
	if err != nil {
		return err
	}
	client, pool, err := env.connectClient(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	info, err := client.JobGet(ctx, id)
	deleted := errors.Is(err, queue.ErrNotFound)
	if err != nil && !deleted {
		return explainSchemaError(fmt.Errorf("show job %d: %w", id, err), env.schema)
	}
	j := jobRow{JobInfo: info}
	evs, err := client.JobEvents(ctx, id)
	if err != nil {
		return explainSchemaError(err, env.schema)
	}
	for _, e := range evs {
		j.Events = append(j.Events, eventRow{ID: e.ID, Queue: e.Queue, Kind: e.Kind, Type: string(e.Type), Attempt: e.Attempt, At: e.At, Data: e.Data})
	}
	if deleted {
		if len(j.Events) == 0 {
			return fmt.Errorf("job %d not found in schema %s", id, env.schema)
		}
		// Retention deleted the row; the event log still has its history.
		j = jobRow{JobInfo: queue.JobInfo{ID: id, Queue: j.Events[0].Queue, Kind: j.Events[0].Kind}, Events: j.Events}
	}
	if *asJSON {
		enc := json.NewEncoder(termsafe.JSON(env.stdout))
		enc.SetIndent("", "  ")
		if deleted {
			return enc.Encode(deletedJob{ID: j.ID, Queue: j.Queue, Kind: j.Kind, Deleted: true, Events: j.Events})
		}
		return enc.Encode(j)
	}
	w := env.stdout
	ts := func(t time.Time) string { return t.Local().Format("2006-01-02 15:04:05.000 MST") }
	// Anyone who can write a job chose these strings: no terminal escapes.
	j.Queue, j.Kind, j.State, j.UniqueKey = termsafe.Text(j.Queue, false), termsafe.Text(j.Kind, false), queue.JobState(termsafe.Text(string(j.State), false)), termsafe.Text(j.UniqueKey, false)
	fmt.Fprintf(w, "job %d\n", j.ID)
	if deleted {
		fmt.Fprintf(w, "  (row deleted by retention; history from the event log)\n  queue:        %s\n  kind:         %s\n", j.Queue, j.Kind)
		return printEvents(w, j.Events, ts)
	}
	fmt.Fprintf(w, "  queue:        %s\n  kind:         %s\n  state:        %s\n  priority:     %d\n  attempts:     %d of %d\n",
		j.Queue, j.Kind, j.State, j.Priority, j.Attempts, j.MaxAttempts)
	fmt.Fprintf(w, "  created:      %s\n  run after:    %s\n", ts(j.CreatedAt), ts(j.RunAfter))
	if j.FinishedAt != nil {
		fmt.Fprintf(w, "  finished:     %s\n", ts(*j.FinishedAt))
	}
	if j.UniqueKey != "" {
		fmt.Fprintf(w, "  unique key:   %s\n", uniqueText(j.JobInfo))
	}
	if j.HeldUntil != nil {
		fmt.Fprintf(w, "  held until:   %s\n", ts(*j.HeldUntil))
	}
	if len(j.Metadata) > 0 {
		fmt.Fprintf(w, "  metadata:     %s\n", metadataText(j.Metadata, "\n                "))
	}
	if j.LastError != "" {
		fmt.Fprintf(w, "  last error:   %s\n", indentMore(termsafe.Text(j.LastError, true)))
	}
	fmt.Fprintf(w, "  payload:      %s\n", termsafe.Text(shorten(string(j.Payload), 2000), false))
	return printEvents(w, j.Events, ts)
}

func printEvents(w io.Writer, events []eventRow, ts func(time.Time) string) error {
	fmt.Fprintf(w, "events:\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, e := range events {
		data := ""
		if len(e.Data) > 0 && string(e.Data) != "{}" {
			data = termsafe.Text(shorten(string(e.Data), 200), false)
		}
		fmt.Fprintf(tw, "  %s\t%s\tattempt %d\t%s\n", ts(e.At), termsafe.Text(e.Type, false), e.Attempt, data)
	}
	return tw.Flush()
}

// jobsChange retries (retry=true) or cancels jobs.
func jobsChange(ctx context.Context, env *cliEnv, args []string, retry bool) error {
	req, err := parseJobsChange(env, args, retry)
	if err != nil {
		return err
	}
	client, pool, err := env.connectClient(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	ids := req.ids
	if req.all {
		if ids, err = failedIDs(ctx, client, req.queue, req.kind); err != nil {
			return explainSchemaError(err, env.schema)
		}
		if len(ids) == 0 {
			fmt.Fprintln(env.stdout, "no failed jobs match")
			return nil
		}
	}
	return applyJobsChange(ctx, env, client, ids, retry)
}

// jobsChangeRequest is what `jobs retry|cancel` was asked to do.
type jobsChangeRequest struct {
	ids         []int64
	all         bool // retry --all-failed
	queue, kind string
}

// parseJobsChange reads the flags and ids of `jobs retry|cancel`.
func parseJobsChange(env *cliEnv, args []string, retry bool) (jobsChangeRequest, error) {
	fs := env.flags()
	var allFailed *bool
	var q, kind *string
	if retry {
		allFailed = fs.Bool("all-failed", false, "retry every failed job (narrow with --queue, --kind)")
		q = fs.String("queue", "", "with --all-failed: only this queue")
		kind = fs.String("kind", "", "with --all-failed: only this kind")
	}
	var req jobsChangeRequest
	if err := env.parse(fs, args); err != nil {
		return req, err
	}
	for _, a := range fs.Args() {
		id, err := parseID(a)
		if err != nil {
			return req, err
		}
		req.ids = append(req.ids, id)
	}
	req.all = allFailed != nil && *allFailed
	if retry {
		req.queue, req.kind = *q, *kind
	}
	switch {
	case req.all && len(req.ids) > 0:
		return req, usagef("give job ids or --all-failed, not both")
	case !req.all && len(req.ids) == 0:
		if retry {
			return req, usagef("expected job ids or --all-failed")
		}
		return req, usagef("expected job ids")
	case !req.all && retry && (req.queue != "" || req.kind != ""):
		return req, usagef("--queue and --kind narrow --all-failed; with ids, give only ids")
	}
	return req, nil
}

// failedIDs lists the failed jobs of queue and kind (empty: any), oldest
// first, through the read API.
func failedIDs(ctx context.Context, client *queue.Client, q, kind string) ([]int64, error) {
	var ids []int64
	p := queue.JobListParams{State: queue.StateFailed, Queue: q, Kind: kind, Limit: queue.MaxJobListLimit}
	for {
		page, err := client.JobList(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("find failed jobs: %w", err)
		}
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		if page.Next == 0 {
			break
		}
		p.Before = page.Next
	}
	slices.Reverse(ids) // oldest first
	return ids, nil
}

// applyJobsChange retries or cancels each job, reporting each one done and
// skipping (with a note) a retry whose unique key is held; the error names
// the jobs it could not change.
func applyJobsChange(ctx context.Context, env *cliEnv, client *queue.Client, ids []int64, retry bool) error {
	var missed, held []string
	done := 0
	for _, id := range ids {
		var err error
		if retry {
			err = client.Retry(ctx, id)
		} else {
			err = client.Cancel(ctx, id)
		}
		switch {
		case err == nil:
			done++
			fmt.Fprintf(env.stdout, "%s %d\n", map[bool]string{true: "retried", false: "cancelled"}[retry], id)
		case errors.Is(err, queue.ErrNotFound):
			missed = append(missed, strconv.FormatInt(id, 10))
		case errors.Is(err, queue.ErrUniqueKeyHeld):
			// Reported and skipped: the others are still retried.
			fmt.Fprintf(env.stderr, "pgwake jobs retry: skipped job %d: %v\n", id, err)
			held = append(held, strconv.FormatInt(id, 10))
		default:
			return explainSchemaError(err, env.schema)
		}
	}
	if len(held) > 0 && len(missed) == 0 {
		return fmt.Errorf("could not retry job(s) %s: their unique keys are held by other jobs (see above); %d other(s) done",
			strings.Join(held, ", "), done)
	}
	missed = append(missed, held...)
	if len(missed) > 0 {
		verb, want := "cancel", "pending"
		if retry {
			verb, want = "retry", "failed"
		}
		return fmt.Errorf("could not %s job(s) %s: no such job, or not %s (see `pgwake jobs show ID`); %d other(s) done",
			verb, strings.Join(missed, ", "), want, done)
	}
	return nil
}

// reorderArgs moves positional arguments after the flags, so "show 42 --json"
// parses like "show --json 42".
func reorderArgs(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // Parse reports it
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return append(flags, pos...)
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, usagef("job id %q is not a positive integer", s)
	}
	return id, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func shorten(s string, n int) string {
	s = oneLine(s)
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && cut < len(s) && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "..."
}

// uniqueText is a job's unique key with its scope and hold ("" without a
// key), terminal-safe.
func uniqueText(j queue.JobInfo) string {
	if j.UniqueKey == "" {
		return ""
	}
	return fmt.Sprintf("%s (scope %s, hold %s)", termsafe.Text(j.UniqueKey, false), termsafe.Text(string(j.UniqueScope), false),
		termsafe.Text(string(j.UniqueHold), false))
}

// metadataText is a job's metadata as key=value pairs in key order, joined
// by sep, terminal-safe.
func metadataText(m map[string]string, sep string) string {
	pairs := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		pairs = append(pairs, termsafe.Text(k, false)+"="+termsafe.Text(m[k], false))
	}
	return strings.Join(pairs, sep)
}

// orDash is s, or "-" when s is empty (an empty table cell).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func indentMore(s string) string {
	return strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n                ")
}

// jobsPrune deletes expired finished jobs once (queue.Client.DeleteFinished).
func jobsPrune(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	var r queue.Retention
	checkRetention := retentionFlags(fs, "", &r)
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := checkRetention(); err != nil {
		return err
	}
	client, pool, err := env.connectClient(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := client.DeleteFinished(ctx, r)
	if err != nil {
		return explainSchemaError(err, env.schema)
	}
	fmt.Fprintf(env.stdout, "deleted %d jobs (%d succeeded, %d cancelled, %d failed)\n",
		n[queue.StateSucceeded]+n[queue.StateCancelled]+n[queue.StateFailed], n[queue.StateSucceeded], n[queue.StateCancelled], n[queue.StateFailed])
	return nil
}

// retentionFlags defines --<prefix>succeeded, --<prefix>cancelled and
// --<prefix>failed on fs, filling r, and returns the check to run after
// parsing: a zero period would delete every job of its state at once.
func retentionFlags(fs *flag.FlagSet, prefix string, r *queue.Retention) (check func() error) {
	fs.DurationVar(&r.Succeeded, prefix+"succeeded", queue.DefaultRetainSucceeded, "delete succeeded jobs finished longer ago than this (negative: keep)")
	fs.DurationVar(&r.Cancelled, prefix+"cancelled", queue.DefaultRetainCancelled, "delete cancelled jobs cancelled longer ago than this (negative: keep)")
	fs.DurationVar(&r.Failed, prefix+"failed", queue.DefaultRetainFailed, "delete failed jobs whose last attempt is older than this (negative: keep)")
	return func() error {
		for _, f := range []struct {
			state string
			d     time.Duration
		}{{"succeeded", r.Succeeded}, {"cancelled", r.Cancelled}, {"failed", r.Failed}} {
			if f.d == 0 {
				return usagef("--%s%s 0 would delete every %s job: give a period, or a negative one to keep them", prefix, f.state, f.state)
			}
		}
		return nil
	}
}
