package harness

import "github.com/pgwake/pgwake/internal/bench"

// Types of the harness; see internal/bench.
type (
	// System is a job queue under test.
	System = bench.System
	// Counter is a System that can count its unfinished jobs.
	Counter = bench.Counter
	// Finisher is a System that can fill its table with finished jobs.
	Finisher = bench.Finisher
	// Diagnoser is a System that can explain a run with counters.
	Diagnoser = bench.Diagnoser
	// Env is what a System runs on.
	Env = bench.Env
	// Job is one benchmark job.
	Job = bench.Job
	// HandleFunc is what a System's handler calls first.
	HandleFunc = bench.HandleFunc
	// Mode names a benchmark mode.
	Mode = bench.Mode
	// Options configures Run.
	Options = bench.Options
	// Sizes are the modes' parameters.
	Sizes = bench.Sizes
	// Result is one mode's outcome for one system.
	Result = bench.Result
	// Pgwake is pgwake as a System.
	Pgwake = bench.Pgwake
)

// The modes.
const (
	ModeDrain   = bench.ModeDrain
	ModeLatency = bench.ModeLatency
	ModeIdle    = bench.ModeIdle
	ModeDelayed = bench.ModeDelayed
	ModeEnqueue = bench.ModeEnqueue
	ModeScale   = bench.ModeScale
	// ModeScheduled and ModeHousekeeping: see internal/bench.
	ModeScheduled    = bench.ModeScheduled
	ModeHousekeeping = bench.ModeHousekeeping
)

// Functions of the harness; see internal/bench.
var (
	// Run runs the modes for every system and prints the report.
	Run = bench.Run
	// ParseModes parses a comma-separated mode list.
	ParseModes = bench.ParseModes
	// DefaultSizes returns the default sizes.
	DefaultSizes = bench.DefaultSizes
	// EncodePayload returns a job's payload JSON, {"seq":N}.
	EncodePayload = bench.EncodePayload
	// DecodePayload returns the seq of a payload.
	DecodePayload = bench.DecodePayload
	// Commit names the pgwake commit under measurement.
	Commit = bench.Commit
	// Flags defines the bench command line on a flag.FlagSet.
	Flags = bench.Flags
)
