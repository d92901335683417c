package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/pgwake/pgwake/internal/termsafe"
	"github.com/pgwake/pgwake/queue"
)

func init() {
	register(command{
		name:    "queues",
		summary: "list queues, pause or resume one",
		usage: `Usage: pgwake queues list [--json]
       pgwake queues pause QUEUE
       pgwake queues resume QUEUE

list    queues that are paused or have pending jobs, with their pause
        state.
pause   stops every worker on the schema from claiming the queue's jobs
        (running workers obey when a notification on the wake channel
        reaches them; at their --poll-interval if it is lost). Jobs
        already running finish; enqueues still go in. The pause is stored in
        the database: workers started later obey it too.
resume  ends the pause; workers claim when its notification arrives.

Example:
  pgwake queues pause email && pgwake queues list`,
		run: runQueues,
	})
	register(command{
		name:    "periodic",
		summary: "list periodic schedules with their last and next slot",
		usage: `Usage: pgwake periodic list [--json]

Lists the periodic schedules that workers (pgwake worker --periodic, or
queue.Config.Periodic) have run on the schema: name, spec, kind, queue,
the last slot (the latest enqueued or skipped; its job may still wait for
its time) and the next slot to enqueue. Times are UTC.

Example:
  pgwake periodic list`,
		run: runPeriodic,
	})
}

func runQueues(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 {
		return usagef("expected an action: list, pause or resume")
	}
	action, rest := args[0], args[1:]
	fs := env.flags()
	asJSON := fs.Bool("json", false, "print JSON instead of a table (list)")
	if action == "-h" || action == "--help" || action == "-help" {
		env.printHelp(fs)
		return errHelp
	}
	if err := env.parse(fs, rest); err != nil {
		return err
	}
	switch action {
	case "list":
		if fs.NArg() > 0 {
			return usagef("unexpected argument %q", fs.Arg(0))
		}
	case "pause", "resume":
		if fs.NArg() != 1 {
			return usagef("%s takes one queue name", action)
		}
		if err := queue.ValidateQueue(fs.Arg(0)); err != nil {
			return usagef("%v", err)
		}
	default:
		return usagef("unknown action %q: use list, pause or resume", action)
	}
	client, pool, err := env.connectClient(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch action {
	case "pause":
		if err := client.PauseQueue(ctx, fs.Arg(0)); err != nil {
			return explainSchemaError(err, env.schema)
		}
		fmt.Fprintf(env.stdout, "queue %s paused\n", fs.Arg(0))
		return nil
	case "resume":
		if err := client.ResumeQueue(ctx, fs.Arg(0)); err != nil {
			return explainSchemaError(err, env.schema)
		}
		fmt.Fprintf(env.stdout, "queue %s resumed\n", fs.Arg(0))
		return nil
	}
	qs, err := client.Queues(ctx)
	if err != nil {
		return explainSchemaError(err, env.schema)
	}
	if *asJSON {
		return printQueuesJSON(env, qs)
	}
	return printQueues(env, qs)
}

// printQueuesJSON prints queues list --json.
func printQueuesJSON(env *cliEnv, qs []queue.QueueState) error {
	type row struct {
		Queue    string     `json:"queue"`
		Paused   bool       `json:"paused"`
		PausedAt *time.Time `json:"paused_at,omitempty"`
	}
	out := struct {
		Queues []row `json:"queues"`
	}{Queues: []row{}}
	for _, q := range qs {
		r := row{Queue: q.Queue, Paused: q.Paused}
		if q.Paused {
			at := q.PausedAt.UTC()
			r.PausedAt = &at
		}
		out.Queues = append(out.Queues, r)
	}
	return json.NewEncoder(termsafe.JSON(env.stdout)).Encode(out)
}

// printQueues prints queues list as a table.
func printQueues(env *cliEnv, qs []queue.QueueState) error {
	if len(qs) == 0 {
		_, err := fmt.Fprintln(env.stdout, "no queue is paused or has pending jobs")
		return err
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tSTATE\tSINCE")
	for _, q := range qs {
		state, since := "active", "-"
		if q.Paused {
			state, since = "paused", q.PausedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", termsafe.Text(q.Queue, false), state, since)
	}
	return tw.Flush()
}

func runPeriodic(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 {
		return usagef("expected an action: list")
	}
	action, rest := args[0], args[1:]
	fs := env.flags()
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if action == "-h" || action == "--help" || action == "-help" {
		env.printHelp(fs)
		return errHelp
	}
	if action != "list" {
		return usagef("unknown action %q: use list", action)
	}
	if err := env.parseNoArgs(fs, rest); err != nil {
		return err
	}
	client, pool, err := env.connectClient(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	list, err := client.PeriodicSchedules(ctx)
	if err != nil {
		return explainSchemaError(err, env.schema)
	}
	stamp := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		u := t.UTC()
		return &u
	}
	if *asJSON {
		type row struct {
			Name     string     `json:"name"`
			Spec     string     `json:"spec"`
			Kind     string     `json:"kind"`
			Queue    string     `json:"queue"`
			LastSlot *time.Time `json:"last_slot"`
			NextSlot *time.Time `json:"next_slot"`
		}
		out := struct {
			Schedules []row `json:"schedules"`
		}{Schedules: []row{}}
		for _, s := range list {
			out.Schedules = append(out.Schedules, row{s.Name, s.Spec, s.Kind, s.Queue, stamp(s.LastSlot), stamp(s.NextSlot)})
		}
		return json.NewEncoder(termsafe.JSON(env.stdout)).Encode(out)
	}
	if len(list) == 0 {
		_, err := fmt.Fprintln(env.stdout, "no periodic schedules")
		return err
	}
	show := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSPEC\tKIND\tQUEUE\tLAST SLOT\tNEXT SLOT")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Spec, s.Kind, s.Queue, show(s.LastSlot), show(s.NextSlot))
	}
	return tw.Flush()
}
