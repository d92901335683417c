package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/pgwake/pgwake/migrations"
)

func init() {
	register(command{
		name:    "migrate",
		summary: "create or upgrade pgwake's tables (up), or list migrations (status)",
		usage: `Usage: pgwake migrate [up|status] [flags]

Applies pgwake's embedded SQL migrations to the schema (up, the default) or
lists every migration with when it was applied (status). Safe to run from
several processes at once: a lock on the schema_migrations table serialises
them, and applied migrations are skipped.

up refuses a schema (or schema_migrations table) that exists and is owned by
a role other than yours, one you belong to, or a superuser: its owner
controls what runs there. --allow-foreign-schema migrates it anyway.

Example:
  PGWAKE_DATABASE_URL=postgres://app@localhost/app pgwake migrate
  pgwake migrate status --schema pgwake`,
		run: runMigrate,
	})
}

func runMigrate(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	allowForeign := fs.Bool("allow-foreign-schema", false, "up: migrate a schema owned by a role you do not belong to")
	if err := env.parse(fs, args); err != nil {
		return err
	}
	action := "up"
	switch fs.NArg() {
	case 0:
	case 1:
		action = fs.Arg(0)
	default:
		return usagef("expected at most one action (up or status), got %q", fs.Args())
	}
	if action != "up" && action != "status" {
		return usagef("unknown action %q: use up or status", action)
	}
	pool, err := env.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	if action == "up" {
		ran, err := migrations.UpWithOptions(ctx, pool, env.schema, migrations.Options{AllowForeignSchema: *allowForeign})
		if err != nil {
			return err
		}
		if len(ran) == 0 {
			fmt.Fprintf(env.stdout, "schema %s is up to date\n", env.schema)
			return nil
		}
		for _, v := range ran {
			fmt.Fprintf(env.stdout, "applied %04d to schema %s\n", v, env.schema)
		}
		return nil
	}
	st, err := migrations.StatusOf(ctx, pool, env.schema)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED")
	for _, s := range st {
		at := "pending"
		if !s.AppliedAt.IsZero() {
			at = s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
		}
		fmt.Fprintf(tw, "%04d\t%s\t%s\n", s.Version, s.Name, at)
	}
	return tw.Flush()
}
