package bench

import (
	"flag"
	"fmt"
)

// Flags defines the bench flags (modes, runs, workers, output and every
// size) on fs, so that `pgwake bench` and the peers program take the same
// command line. After fs.Parse, call the returned function for the
// Options; it rejects a flag explicitly set to zero (zero means "default"
// in Options and Sizes, which on a command line is a mistake) except
// --scale-finished 0 and --scheduled-failed 0, which skip those cases.
func Flags(fs *flag.FlagSet) func() (Options, error) {
	var (
		modes string
		o     Options
		s     Sizes
	)
	d := DefaultSizes()
	fs.StringVar(&modes, "modes", "all", "comma-separated modes: drain, latency, idle, delayed, enqueue, scale, scheduled, housekeeping, queues, concurrent, or all; stream (pgwake bench only, needs NATS JetStream) only when named")
	fs.BoolVar(&o.JSON, "json", false, "print one JSON object per mode and system instead of tables")
	fs.IntVar(&o.Runs, "runs", 1, "repeat every mode this many times and report the medians")
	fs.IntVar(&o.Workers, "workers", 10, "jobs run at once by each system (pgwake MaxWorkers, whose default is 10)")
	fs.StringVar(&o.SVG, "svg", "", "also write the latency chart as SVG to this file")
	fs.IntVar(&s.DrainJobs, "jobs", d.DrainJobs, "drain: jobs pre-inserted")
	fs.Float64Var(&s.Rate, "rate", d.Rate, "latency: jobs per second")
	fs.IntVar(&s.LatencyProducers, "latency-producers", 0, "latency, scheduled: concurrent producers, one job per transaction (default max(4, ceil(rate/250)))")
	fs.DurationVar(&s.LatencyDuration, "duration", d.LatencyDuration, "latency: how long to produce")
	fs.DurationVar(&s.IdleInterval, "idle-interval", d.IdleInterval, "idle: time between jobs")
	fs.DurationVar(&s.IdleDuration, "idle-duration", d.IdleDuration, "idle: how long to produce")
	fs.IntVar(&s.DelayedJobs, "delayed-jobs", d.DelayedJobs, "delayed: how many jobs")
	fs.DurationVar(&s.DelayedSpread, "delayed-spread", d.DelayedSpread, "delayed: span of their run_after times")
	fs.IntVar(&s.Producers, "producers", d.Producers, "enqueue: concurrent producers")
	fs.DurationVar(&s.EnqueueDuration, "enqueue-duration", d.EnqueueDuration, "enqueue: total time, half of it on the baseline")
	fs.IntVar(&s.ScaleSmall, "scale-small", d.ScaleSmall, "scale: the small backlog")
	fs.IntVar(&s.ScaleLarge, "scale-large", d.ScaleLarge, "scale: the large backlog (the scale target is 1000000)")
	fs.IntVar(&s.ScaleFinished, "scale-finished", d.ScaleFinished, "scale: finished jobs left in the table for the third case (0 skips it)")
	fs.IntVar(&s.ConcurrentJobs, "concurrent-jobs", d.ConcurrentJobs, "concurrent: jobs, all allowed to run at once")
	fs.DurationVar(&s.ConcurrentSleep, "concurrent-sleep", d.ConcurrentSleep, "concurrent: how long each handler sleeps")
	fs.IntVar(&s.ConcurrentPool, "concurrent-pool", d.ConcurrentPool, "concurrent: connections in the mode's own pool")
	fs.DurationVar(&s.ConcurrentLease, "concurrent-lease", d.ConcurrentLease, "concurrent: pgwake-leased's LeaseDuration (its heartbeat runs every third of it; 0: the default, 30s)")
	fs.IntVar(&s.ScheduledJobs, "scheduled-jobs", d.ScheduledJobs, "scheduled: jobs scheduled 1h-7d ahead for the second latency run")
	fs.IntVar(&s.ScheduledFailed, "scheduled-failed", d.ScheduledFailed, "scheduled: failed jobs kept by retention (finished 1-6 days ago) added for the third latency run (0 skips it)")
	fs.IntVar(&s.HousekeepingSmall, "housekeeping-small", d.HousekeepingSmall, "housekeeping: finished jobs and events kept, first case")
	fs.IntVar(&s.HousekeepingLarge, "housekeeping-large", d.HousekeepingLarge, "housekeeping: finished jobs and events kept, second case")
	fs.IntVar(&s.HousekeepingExpired, "housekeeping-expired", d.HousekeepingExpired, "housekeeping: expired jobs and events deleted in each case")
	fs.IntVar(&s.QueuesJobs, "queues-jobs", d.QueuesJobs, "queues: jobs enqueued in one call, each in a queue of its own")
	fs.IntVar(&s.BatchSize, "batch", d.BatchSize, "jobs per bulk insert call when pre-inserting")
	fs.DurationVar(&s.IdleTimeout, "idle-timeout", d.IdleTimeout, "give up when no job has started for this long")
	fs.IntVar(&s.StreamJobs, "stream-jobs", d.StreamJobs, "stream: jobs drained while the event stream forwards to NATS")
	return func() (Options, error) {
		var zero string
		fs.Visit(func(f *flag.Flag) {
			if v := f.Value.String(); zero == "" && f.Name != "scale-finished" && f.Name != "scheduled-failed" && (v == "0" || v == "0s") {
				zero = f.Name
			}
		})
		if zero != "" {
			return Options{}, fmt.Errorf("%w: --%s must be positive", ErrInvalidOptions, zero)
		}
		ms, err := ParseModes(modes)
		if err != nil {
			return Options{}, fmt.Errorf("--modes: %w", err)
		}
		if s.ScaleFinished == 0 {
			s.ScaleFinished = -1
		}
		if s.ScheduledFailed == 0 {
			s.ScheduledFailed = -1
		}
		o.Modes, o.Sizes = ms, s
		o.Sizes = o.Sizes.withDefaults()
		if err := o.withDefaults().validate(); err != nil {
			return Options{}, err
		}
		return o, nil
	}
}
