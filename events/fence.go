package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// A relay that stops running for a while (a GC pause, a VM migration, a
// laptop lid, SIGSTOP) while it holds transactions it has not published
// yet can lose its slot meanwhile: its walsender ends (wal_sender_timeout)
// and a standby takes the slot over and publishes from the slot's
// confirmed position. Once the paused relay runs again, its publisher
// would go on publishing what it held, at the same time as the standby
// (TestPausedRelayDoesNotPublishAfterTheStandbyTookOver: 65 events in
// Publish calls started after the resume). So a session publishes only
// while it knows its walsender holds the slot: a check (the slot's
// active_pid is this session's backend) counts for fenceFresh from the
// moment it started, by both the monotonic and the wall clock (the
// monotonic clock stands still while the machine sleeps). After a longer
// pause, or a busy spell, the next publication checks again first; a slot
// that streams to another session ends the session (errNotOurs), which
// then stands by. What a Publish call already under way when the process
// stopped sends is not fenced: the broker would have to refuse it.

// fenceFresh is how long a check that the slot is this session's counts:
// far below wal_sender_timeout (60 s by default; keep it above a second),
// so that no walsender can have timed out since.
const fenceFresh = 500 * time.Millisecond

// errNotOurs ends a session whose slot streams to another session.
var errNotOurs = errors.New("events: the slot no longer streams to this session (its walsender ended while the process was paused?); publishing stopped")

// errServerStopping ends a session whose slot check (or, with the
// publisher stuck, the reader's look: stuckServer) found the server
// shutting down (SQLSTATE class 57P: cannot_connect_now, admin_shutdown,
// crash_shutdown). A fast shutdown waits for each walsender until its
// client has confirmed all it was sent: a session that held unpublished
// transactions and kept waiting to check its slot again held the shutdown
// until pg_ctl gave up (a CI run of 2026-12-03:
// TestStreamSurvivesPostgresRestart). Ending the session closes the
// replication connection, so the shutdown goes on; the stream reconnects
// as after any interruption and publishes again from the slot's confirmed
// position.
var errServerStopping = errors.New("events: the server is shutting down; the session ends and reconnects")

// notOurs is err when it is errNotOurs or errServerStopping, which end the
// session with it; nil for the stop (ctx), which ends it quietly.
func notOurs(err error) error {
	if errors.Is(err, errNotOurs) || errors.Is(err, errServerStopping) {
		return err
	}
	return nil
}

// serverStopping is errServerStopping wrapping err when err says the
// server is shutting down or refuses connections while it does; else nil.
func serverStopping(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && strings.HasPrefix(pe.Code, "57P") {
		return fmt.Errorf("%w: %w", errServerStopping, err)
	}
	return nil
}

type fence struct {
	s   *Stream
	pid uint32 // the session's walsender

	mu   sync.Mutex
	ok   time.Time // start of the last check that found the slot ours (with its monotonic reading)
	okNS int64     // the same start by the wall clock
}

// fresh reports whether the last successful check still counts.
func (f *fence) fresh() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ok.IsZero() {
		return false
	}
	mono := time.Since(f.ok)
	wall := time.Now().UnixNano() - f.okNS
	return mono >= 0 && mono < fenceFresh && wall >= 0 && wall < int64(fenceFresh)
}

// check returns nil when the session may publish now: ctx is not done and
// the slot streams to the session's walsender. It returns ctx's error when
// ctx ends first, errNotOurs when the slot is another's (or gone).
func (f *fence) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.fresh() {
		return nil
	}
	for {
		start := time.Now()
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var active *int32
		err := f.s.pool.QueryRow(qctx, `SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, f.s.cfg.Slot).Scan(&active)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case err == nil && active != nil && uint32(*active) == f.pid:
			f.mu.Lock()
			f.ok, f.okNS = start, start.UnixNano()
			f.mu.Unlock()
			return nil
		case err == nil, errors.Is(err, pgx.ErrNoRows):
			f.s.log.Warn("the slot no longer streams to this session; publishing stopped", zap.String("slot", f.s.cfg.Slot))
			return errNotOurs
		}
		if err := serverStopping(err); err != nil {
			return err
		}
		f.s.log.Warn("could not check that the slot still streams to this session; not publishing meanwhile",
			zap.String("slot", f.s.cfg.Slot), zap.Error(fmt.Errorf("events: slot check: %w", err)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
