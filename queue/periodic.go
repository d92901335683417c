package queue

// Periodic jobs. Every running client with Config.Periodic runs the
// schedules; none leads. Each schedule has a row in the periodic table
// (migration 0012) holding the latest slot accounted for. A client that
// finds the next slot close (periodicLead) enqueues its job with run_after
// at the slot, in the transaction that moves the row's last slot forward
// with a conditional UPDATE (WHERE last_slot is what it read): of several
// clients that try, one moves it and the others update nothing and roll
// back. So each slot gets exactly one job, whoever runs, starts late or
// restarts, and the job starts when due with the delayed-job timer.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/robfig/cron/v3"
	"go.uber.org/zap"
)

// PeriodicJob is a job enqueued once per slot of a schedule.
type PeriodicJob struct {
	// Name identifies the schedule in the database: clients with the same
	// Name share its slots (and should share its Spec). Default: Job.Kind.
	// Renaming a schedule starts it afresh.
	Name string
	// Spec is the schedule: a cron spec of 5 fields (minute hour
	// day-of-month month day-of-week) or 6 (seconds first), a descriptor
	// (@hourly, @daily, @weekly, @monthly, @yearly), optionally after
	// "CRON_TZ=Europe/Paris " (default UTC); or "@every D" (D a Go duration
	// of at least MinPeriodicInterval): slots at the multiples of D since
	// the zero time, the same in every process. Required.
	Spec string
	// Job is what each slot enqueues: Kind (required), Queue, Payload,
	// Priority, MaxAttempts as in Enqueue. RunAfter (the slot), Delay and
	// UniqueKey must be zero.
	Job NewJob
	// SkipMissed skips slots that passed while no client ran the schedule.
	// Default false: the latest of them is enqueued once, due at once, when
	// a client starts.
	SkipMissed bool
}

// MinPeriodicInterval is the shortest "@every" interval.
const MinPeriodicInterval = 50 * time.Millisecond

// periodicLead is how long before its slot a periodic job is enqueued (for
// a short interval, every slot within it).
const periodicLead = time.Second

// periodicRetry is how long a schedule waits after a failed tick.
const periodicRetry = time.Second

// maxMissedSteps bounds the count of missed cron slots (a log line's).
const maxMissedSteps = 1 << 14

// maxAhead caps the slots one tick enqueues ahead.
const maxAhead = 64

// ErrInvalidPeriodic is wrapped by the error for a Config.Periodic entry
// New rejects.
var ErrInvalidPeriodic = errors.New("invalid periodic job")

// schedule gives the first slot strictly after t.
type schedule interface {
	next(t time.Time) time.Time
}

// everySchedule is "@every D": the multiples of d since the zero time.
type everySchedule struct{ d time.Duration }

func (e everySchedule) next(t time.Time) time.Time { return t.Truncate(e.d).Add(e.d) }

// cronSchedule is a parsed cron spec, evaluated in UTC unless it names a
// zone.
type cronSchedule struct{ s cron.Schedule }

func (c cronSchedule) next(t time.Time) time.Time { return c.s.Next(t.UTC()) }

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseSchedule parses a PeriodicJob.Spec.
func parseSchedule(spec string) (schedule, error) {
	spec = strings.TrimSpace(spec)
	if rest, ok := strings.CutPrefix(spec, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return nil, fmt.Errorf("%w: spec %q: %q is not a duration like 200ms or 5m", ErrInvalidPeriodic, spec, rest)
		}
		if d < MinPeriodicInterval {
			return nil, fmt.Errorf("%w: spec %q: interval below %s", ErrInvalidPeriodic, spec, MinPeriodicInterval)
		}
		return everySchedule{d: d}, nil
	}
	if spec == "" {
		return nil, fmt.Errorf("%w: empty spec", ErrInvalidPeriodic)
	}
	s, err := parseCron(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: spec %q: %v", ErrInvalidPeriodic, spec, err)
	}
	cs := cronSchedule{s: s}
	if cs.next(time.Now()).IsZero() {
		return nil, fmt.Errorf("%w: spec %q: no slot in the next five years", ErrInvalidPeriodic, spec)
	}
	return cs, nil
}

// parseCron is the cron parser, which panics on some inputs ("CRON_TZ="
// and nothing more, found by FuzzPeriodicFlag): a panic is an error.
func parseCron(spec string) (s cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot parse: %v", r)
		}
	}()
	return cronParser.Parse(spec)
}

// ParseSpec checks a PeriodicJob.Spec; the error wraps ErrInvalidPeriodic.
func ParseSpec(spec string) error {
	_, err := parseSchedule(spec)
	return err
}

// validatePeriodic checks cfg.Periodic (cfg has its defaults).
func validatePeriodic(cfg Config) error {
	names := map[string]bool{}
	probe := &Client{cfg: cfg}
	for i, p := range cfg.Periodic {
		bad := func(err error) error {
			return fmt.Errorf("%w: Periodic[%d]: %w", ErrInvalidConfig, i, err)
		}
		if _, err := parseSchedule(p.Spec); err != nil {
			return bad(err)
		}
		if !p.Job.RunAfter.IsZero() || p.Job.Delay != 0 || p.Job.UniqueKey != "" {
			return bad(fmt.Errorf("%w: Job.RunAfter, Delay and UniqueKey must be zero (the slot is the run_after)", ErrInvalidPeriodic))
		}
		if _, err := probe.prepare(i, p.Job); err != nil {
			return bad(err)
		}
		name := p.periodicName()
		if len(name) > 255 || strings.ContainsRune(name, 0) {
			return bad(fmt.Errorf("%w: name %.80q: at most 255 bytes, no NUL", ErrInvalidPeriodic, name))
		}
		if names[name] {
			return bad(fmt.Errorf("%w: name %q given twice (set Name to tell schedules of one kind apart)", ErrInvalidPeriodic, name))
		}
		names[name] = true
	}
	return nil
}

func (p PeriodicJob) periodicName() string {
	if p.Name != "" {
		return p.Name
	}
	return p.Job.Kind
}

// PeriodicState is a schedule as PeriodicSchedules lists it.
type PeriodicState struct {
	Name, Spec, Kind, Queue string
	// LastSlot is the latest slot accounted for: enqueued (its job may wait
	// for its run_after) or skipped. Zero when none yet.
	LastSlot time.Time
	// NextSlot is the slot to be enqueued next (zero if Spec does not parse
	// in this version).
	NextSlot time.Time
	// UpdatedAt is when a client last wrote the row.
	UpdatedAt time.Time
}

// PeriodicSchedules lists the schedules of the schema, by name.
func (c *Client) PeriodicSchedules(ctx context.Context) ([]PeriodicState, error) {
	rows, err := c.pool.Query(ctx, c.sql.periodic.list)
	if err != nil {
		return nil, fmt.Errorf("queue: list periodic schedules: %w", c.notMigrated(err))
	}
	now := time.Now()
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PeriodicState, error) {
		var s PeriodicState
		var last *time.Time
		if err := r.Scan(&s.Name, &s.Spec, &s.Kind, &s.Queue, &last, &s.UpdatedAt); err != nil {
			return s, err
		}
		from := now
		if last != nil {
			s.LastSlot = *last
			from = *last
		}
		if sch, err := parseSchedule(s.Spec); err == nil {
			s.NextSlot = sch.next(from)
		}
		return s, nil
	})
	if err != nil {
		return nil, fmt.Errorf("queue: list periodic schedules: %w", c.notMigrated(err))
	}
	return out, nil
}

// periodicRun is one schedule while Run runs it.
type periodicRun struct {
	PeriodicJob
	name  string
	sched schedule
	at    time.Time // local time of its next tick
}

// runPeriodic runs the configured schedules until ctx is done.
func (c *Client) runPeriodic(ctx context.Context) {
	if len(c.cfg.Periodic) == 0 {
		return
	}
	log := c.log.Named("periodic")
	runs := make([]*periodicRun, len(c.cfg.Periodic))
	for i, p := range c.cfg.Periodic {
		sched, _ := parseSchedule(p.Spec) // validated by New
		runs[i] = &periodicRun{PeriodicJob: p, name: p.periodicName(), sched: sched}
		if runs[i].Job.Queue == "" {
			runs[i].Job.Queue = DefaultQueue
		}
	}
	for _, r := range runs {
		for {
			_, err := c.pool.Exec(ctx, c.sql.periodic.register, r.name, r.Spec, r.Job.Kind, r.Job.Queue)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			log.Warn("registering periodic schedule failed", zap.String("schedule", r.name), zap.Error(err))
			if !sleep(ctx, periodicRetry) {
				return
			}
		}
	}
	for {
		first := time.Time{}
		for _, r := range runs {
			if time.Now().Before(r.at) {
				if first.IsZero() || r.at.Before(first) {
					first = r.at
				}
				continue
			}
			wait, err := c.tickPeriodic(ctx, r)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Warn("periodic tick failed", zap.String("schedule", r.name), zap.Error(err))
				wait = periodicRetry
			}
			r.at = time.Now().Add(wait)
			if first.IsZero() || r.at.Before(first) {
				first = r.at
			}
		}
		if !sleep(ctx, time.Until(first)) {
			return
		}
	}
}

// tickPeriodic enqueues what schedule r needs now: the latest missed slot
// (unless SkipMissed) and the slots within periodicLead. It returns how
// long to wait before the next tick.
func (c *Client) tickPeriodic(ctx context.Context, r *periodicRun) (time.Duration, error) {
	for {
		var last *time.Time
		var now time.Time
		if err := c.pool.QueryRow(ctx, c.sql.periodic.read, r.name).Scan(&last, &now); err != nil {
			return 0, fmt.Errorf("read schedule %s: %w", r.name, err)
		}
		plan := planSlots(r.sched, last, now, r.SkipMissed)
		if plan.newLast.IsZero() {
			return plan.wait, nil
		}
		moved := false
		err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, c.sql.periodic.advance, r.name, last, plan.newLast)
			if err != nil {
				return err
			}
			if moved = tag.RowsAffected() == 1; !moved {
				return nil // another client moved it first: nothing to write
			}
			var jobs []NewJob
			for _, slot := range plan.enqueue {
				j := r.Job
				j.RunAfter = slot
				jobs = append(jobs, j)
			}
			_, err = c.EnqueueManyTx(ctx, tx, jobs)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("enqueue schedule %s: %w", r.name, err)
		}
		if moved {
			for _, slot := range plan.enqueue {
				c.log.Named("periodic").Debug("periodic job enqueued", zap.String("schedule", r.name), zap.Time("slot", slot))
			}
			if plan.skipped > 0 {
				c.log.Named("periodic").Info("missed periodic slots skipped", zap.String("schedule", r.name), zap.Int("slots", plan.skipped))
			}
		}
		// Read again: the slot after the one just written (or the one
		// another client wrote) decides the wait.
	}
}

// latestSlot is the latest slot of s in (cursor, now], which holds one.
// It looks back from now over windows that double, from a second, so its
// cost does not grow with the time since cursor: walking forward from
// cursor stopped at maxMissedSteps far in the past after a long outage (a
// per-second schedule after 12 days), and the slots after that cap were
// enqueued as if due (TestLongOutageEnqueuesOneMissedSlot).
func latestSlot(s schedule, cursor, now time.Time) time.Time {
	for k := time.Second; ; k *= 2 {
		from := now.Add(-k)
		if !from.After(cursor) || k > 1<<62 {
			from = cursor
		}
		if c := s.next(from); !c.IsZero() && !c.After(now) {
			for {
				nx := s.next(c)
				if nx.IsZero() || nx.After(now) {
					return c
				}
				c = nx
			}
		}
		if from.Equal(cursor) {
			return time.Time{} // none: the caller found one, so not reached
		}
	}
}

// countSlots counts the slots of s in (cursor, last], at most
// maxMissedSteps (for the log of skipped slots).
func countSlots(s schedule, cursor, last time.Time) int {
	n := 0
	for c := s.next(cursor); !c.IsZero() && !c.After(last) && n < maxMissedSteps; c = s.next(c) {
		n++
	}
	return n
}

// slotPlan is what a tick writes.
type slotPlan struct {
	enqueue []time.Time   // slots whose jobs to enqueue
	newLast time.Time     // the row's new last slot; zero: write nothing
	skipped int           // missed slots not enqueued
	wait    time.Duration // when newLast is zero: until the next tick
}

// planSlots decides a tick from the row's last slot (nil: a new schedule,
// nothing missed) and the database's clock. Every slot up to periodicLead
// ahead is enqueued (at most maxAhead per tick), so a client late by less
// than periodicLead misses nothing; a slot is missed only when no client
// enqueued it before its time (all stopped, or stalled that long).
func planSlots(s schedule, last *time.Time, now time.Time, skipMissed bool) slotPlan {
	var p slotPlan
	cursor := now
	if last != nil {
		cursor = *last
		if first := s.next(cursor); !first.IsZero() && !first.After(now) {
			// Slots passed with no job: take the latest of them.
			var missed time.Time
			var n int
			if e, ok := s.(everySchedule); ok {
				missed = now.Truncate(e.d)
				n = int(missed.Sub(cursor) / e.d)
			} else {
				missed = latestSlot(s, cursor, now)
				n = countSlots(s, cursor, missed)
				if missed.IsZero() { // not reached: first is one
					missed, n = first, 1
				}
			}
			if skipMissed {
				p.skipped = n
			} else {
				p.enqueue = append(p.enqueue, missed)
				p.skipped = n - 1
			}
			p.newLast, cursor = missed, missed
		}
	}
	horizon := now.Add(periodicLead)
	for slot := s.next(cursor); !slot.IsZero() && !slot.After(horizon) && len(p.enqueue) < maxAhead; slot = s.next(slot) {
		p.enqueue = append(p.enqueue, slot)
		p.newLast = slot
	}
	if p.newLast.IsZero() {
		if next := s.next(cursor); next.IsZero() {
			p.wait = time.Hour // no slot left (a cron date past its last year): look again later
		} else {
			p.wait = next.Sub(horizon)
		}
	}
	return p
}
