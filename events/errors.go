package events

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrWalLevel is returned when the server's wal_level is not logical.
var ErrWalLevel = errors.New("logical replication needs wal_level = logical")

// ErrNoReplicationPrivilege is returned when the replication connection's
// role has neither the REPLICATION attribute nor superuser.
var ErrNoReplicationPrivilege = errors.New("the role lacks the REPLICATION privilege")

// ErrPublication is returned when the publication is missing and cannot be
// created, or does not cover the events table.
var ErrPublication = errors.New("publication on the events table unusable")

// ErrSlot is returned when the named slot exists but cannot be used by this
// stream (another plugin, another database).
var ErrSlot = errors.New("replication slot unusable")

// ErrNotMigrated is returned when <schema>.events does not exist.
var ErrNotMigrated = errors.New("events table missing: run the migrations first")

// PermanentError is a problem a reconnect cannot fix (wal_level, a missing
// REPLICATION privilege, schema or publication, an unusable slot): Run
// returns it instead of retrying. Err wraps one of the sentinels above;
// its text states the cause and how to fix it.
type PermanentError struct{ Err error }

func (p PermanentError) Error() string { return p.Err.Error() }
func (p PermanentError) Unwrap() error { return p.Err }

// IsPermanent reports whether err is (or wraps) a PermanentError.
func IsPermanent(err error) bool {
	var p PermanentError
	return errors.As(err, &p)
}

func walLevelError(level string) error {
	return PermanentError{fmt.Errorf("%w: the server has wal_level = %s; run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL (also check max_replication_slots and max_wal_senders > 0)", ErrWalLevel, level)}
}

// classify turns known server errors into the package's typed errors.
func classify(err error, user string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == "42501" && (strings.Contains(pgErr.Message, "replication") || strings.Contains(pgErr.Message, "walsender")):
		return PermanentError{fmt.Errorf("%w: role %q: %s; grant it with ALTER ROLE %s REPLICATION (as a superuser): %w", ErrNoReplicationPrivilege, user, pgErr.Message, user, err)}
	case pgErr.Code == "42704" && strings.Contains(pgErr.Message, "publication"):
		// The slot decodes WAL written while the publication did not exist
		// (the database was replaced, or the publication dropped); every
		// reconnect meets the same change again.
		return PermanentError{fmt.Errorf("%w: %s; the slot's position predates the publication: drop the slot (pgwake events drop-slot) to start over at the current WAL position: %w", ErrPublication, pgErr.Message, err)}
	case pgErr.Code == "55000" && strings.Contains(pgErr.Message, "cannot read from logical replication slot"):
		// "This slot has been invalidated because it exceeded the maximum
		// reserved size."
		return fmt.Errorf("%w: %w", slotLost(slotName(pgErr.Message)), err)
	case pgErr.Code == "55000" && strings.Contains(pgErr.Message, "wal_level"):
		return PermanentError{fmt.Errorf("%w: %s; run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL: %w", ErrWalLevel, pgErr.Message, err)}
	}
	return err
}

// slotName is the slot a server message names in double quotes, or "".
func slotName(msg string) string {
	_, rest, ok := strings.Cut(msg, `"`)
	name, _, ok2 := strings.Cut(rest, `"`)
	if !ok || !ok2 {
		return ""
	}
	return name
}

// ErrMessageTooLarge is wrapped by a publisher's error when the broker
// refuses a message for its size (NATS max_payload): publishing it again
// cannot succeed, and neither can the dead-letter topic. The stream skips
// such an event (logged with its id, pgwake_events_skipped_total
// {reason="too_large"}) and publishes the rest of its batch; read it from
// the events table (TestEventLargerThanMaxPayload). natsbridge wraps it.
var ErrMessageTooLarge = errors.New("events: message larger than the broker accepts")
