// Command peers runs pgwake's benchmark modes (see internal/bench in the
// main module, reached through bench/harness) against pgwake, River and
// watermill-sql, on one throwaway PostgreSQL (or --database-url), in one
// run, and prints each system's results, the ratios pgwake/peer, a latency
// chart and the targets.
//
// It is a separate module so that River and watermill-sql never enter
// pgwake's own dependencies:
//
//	cd bench/peers && go run . [flags]
//
// Flags are those of `pgwake bench`, plus --systems and --river-workers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/pgwake/pgwake/bench/harness"
)

// Versions of the peers, from the build information.
var (
	riverVersion        = depVersion("github.com/riverqueue/river")
	watermillSQLVersion = depVersion("github.com/ThreeDotsLabs/watermill-sql/v4")
)

func depVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "(unknown version)"
}

// allSystems are the systems --systems can name, in run order.
var allSystems = []string{"pgwake", "pgwake-leased", "river-default", "river-tuned", "watermill-default", "watermill-tuned"}

func newSystem(name string, riverWorkers int) harness.System {
	switch name {
	case "pgwake":
		return &harness.Pgwake{}
	case "pgwake-leased":
		return &harness.Pgwake{Leased: true}
	case "river-default":
		return &riverSystem{workers: riverWorkers}
	case "river-tuned":
		return &riverSystem{tuned: true, workers: riverWorkers}
	case "watermill-default":
		return &watermillSystem{}
	case "watermill-tuned":
		return &watermillSystem{tuned: true}
	}
	return nil
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	options := harness.Flags(fs)
	var systems, url, cpuProfile string
	var riverWorkers int
	fs.IntVar(&riverWorkers, "river-workers", 0, "River's MaxWorkers (default 0: --workers, pgwake's concurrency; 100 is the value of River's documentation)")
	fs.StringVar(&systems, "systems", strings.Join(allSystems, ","), "comma-separated systems to run, pgwake first for the ratios: "+strings.Join(allSystems, ", "))
	fs.StringVar(&url, "database-url", os.Getenv("PGWAKE_DATABASE_URL"), "PostgreSQL URL (default $PGWAKE_DATABASE_URL; empty: a throwaway cluster with fsync on)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write a Go CPU profile of the whole run (every system, the harness and its producers) to this file")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: go run . [--systems LIST] [--modes LIST] [--runs N] [--json] [--svg FILE] [size flags]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	opts, err := options()
	if err != nil {
		fmt.Fprintf(os.Stderr, "peers: %v\n", err)
		return 2
	}
	var syss []harness.System
	for _, name := range strings.Split(systems, ",") {
		s := newSystem(strings.TrimSpace(name), riverWorkers)
		if s == nil {
			fmt.Fprintf(os.Stderr, "peers: --systems: unknown system %q; use %s\n", name, strings.Join(allSystems, ", "))
			return 2
		}
		syss = append(syss, s)
	}
	opts.DatabaseURL = url
	opts.Commit = harness.Commit(".")

	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "peers: --cpuprofile: %v\n", err)
			return 2
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if _, err := harness.Run(ctx, opts, syss...); err != nil {
		fmt.Fprintf(os.Stderr, "peers: %v\n", err)
		return 1
	}
	return 0
}
