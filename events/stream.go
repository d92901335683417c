package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/backoff"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// Metadata keys set on every published message.
const (
	// MetaEventID is the event id, decimal. Deduplicate on it.
	MetaEventID = "pgwake_event_id"
	// MetaLSN is the commit LSN of the event's transaction ("16/B374D848").
	MetaLSN = "pgwake_lsn"
	// MetaJobID is the job id, decimal.
	MetaJobID = "pgwake_job_id"
	// MetaType, MetaQueue and MetaKind repeat the event's fields for routing.
	MetaType  = "pgwake_type"
	MetaQueue = "pgwake_queue"
	MetaKind  = "pgwake_kind"
	// MetaSchema is the schema the event log lives in.
	MetaSchema = "pgwake_schema"
)

// uuidSpace is the namespace of message UUIDs: UUIDv5 of "<schema>:<id>", so
// a re-published event carries the same UUID.
var uuidSpace = uuid.MustParse("6f1d3c2a-94b7-4e0c-9a51-7f2f3b8d0e41")

// MessageUUID returns the Watermill message UUID of an event: a name-based
// (SHA-1) UUID of schema and event id, the same every time it is published.
func MessageUUID(schema string, eventID int64) string {
	return uuid.NewSHA1(uuidSpace, []byte(schema+":"+strconv.FormatInt(eventID, 10))).String()
}

// MessageEventID returns the event id a message carries.
func MessageEventID(msg *message.Message) (int64, error) {
	id, err := strconv.ParseInt(msg.Metadata.Get(MetaEventID), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("events: message %s: metadata %s: %w", msg.UUID, MetaEventID, err)
	}
	return id, nil
}

// MessageLSN returns the commit LSN a message carries.
func MessageLSN(msg *message.Message) (pglogrepl.LSN, error) {
	lsn, err := pglogrepl.ParseLSN(msg.Metadata.Get(MetaLSN))
	if err != nil {
		return 0, fmt.Errorf("events: message %s: metadata %s: %w", msg.UUID, MetaLSN, err)
	}
	return lsn, nil
}

// NewMessage builds the Watermill message of an event committed at lsn
// (Encode'd payload, UUID from MessageUUID, Meta* metadata).
func NewMessage(schema string, e Event, lsn pglogrepl.LSN) (*message.Message, error) {
	payload, err := Encode(e)
	if err != nil {
		return nil, err
	}
	msg := message.NewMessage(MessageUUID(schema, e.ID), payload)
	msg.Metadata.Set(MetaEventID, strconv.FormatInt(e.ID, 10))
	msg.Metadata.Set(MetaLSN, lsn.String())
	msg.Metadata.Set(MetaJobID, strconv.FormatInt(e.JobID, 10))
	msg.Metadata.Set(MetaType, string(e.Type))
	msg.Metadata.Set(MetaQueue, e.Queue)
	msg.Metadata.Set(MetaKind, e.Kind)
	msg.Metadata.Set(MetaSchema, schema)
	return msg, nil
}

// Stream forwards the event log to a Watermill publisher by logical
// replication. Create it with New, run it with Run.
type Stream struct {
	pool    *pgxpool.Pool
	cfg     Config
	replCfg *pgconn.Config
	log     *zap.Logger
	m       *metrics
	types   *pgtype.Map

	running      atomic.Bool
	published    atomic.Uint64 // every event up to this LSN is published
	publishedTxn atomic.Uint64 // transactions (or parts) published in this session
	handed       atomic.Uint64 // transactions (or parts) handed to the publisher in this session
	acked        atomic.Uint64 // last flush position sent to the server
	ackedOn      string        // system id/timeline of the server of the last session, where acked and published were (session's goroutine only)
	pendingSince atomic.Int64  // commit time (unix ns) of the batch being published, 0 if none
	sessions     atomic.Int64  // sessions that reached streaming
	lagBytes     atomic.Int64  // last measured slot lag, for a scrape that cannot measure
	standby      atomic.Bool   // the slot is streaming to another session: waiting for it to end
}

// New checks cfg and returns a Stream; it connects to nothing yet. pool is
// used for checks, the publication, slot lookups and lag measurement.
func New(pool *pgxpool.Pool, cfg Config) (*Stream, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var replCfg *pgconn.Config
	if cfg.ReplConnConfig != nil {
		replCfg = cfg.ReplConnConfig.Copy()
	} else {
		replCfg = pool.Config().ConnConfig.Config.Copy()
	}
	if replCfg.RuntimeParams == nil {
		replCfg.RuntimeParams = map[string]string{}
	}
	replCfg.RuntimeParams["replication"] = "database"
	// pgoutput renders values with the walsender's settings.
	replCfg.RuntimeParams["timezone"] = "UTC"
	replCfg.RuntimeParams["datestyle"] = "ISO"
	replCfg.RuntimeParams["application_name"] = "pgwake_events_" + cfg.Slot
	s := &Stream{pool: pool, cfg: cfg, replCfg: replCfg, log: cfg.Logger.Named("events"), types: pgtype.NewMap()}
	m, err := newMetrics(cfg.Registerer, cfg.Slot, s.scrapeLagBytes, func() float64 { return s.lagAge().Seconds() })
	if err != nil {
		return nil, err
	}
	s.m = m
	return s, nil
}

// Slot returns the slot name in use.
func (s *Stream) Slot() string { return s.cfg.Slot }

// Acked returns the last WAL position acknowledged to the server: every
// event committed before it was published.
func (s *Stream) Acked() pglogrepl.LSN { return pglogrepl.LSN(s.acked.Load()) }

// Standby reports whether Run is waiting for another session streaming the
// same slot (a second relay) to end, to take over from it.
func (s *Stream) Standby() bool { return s.standby.Load() }

// errSlotActive: START_REPLICATION found the slot streaming to another
// session.
var errSlotActive = errors.New("events: the slot is active in another session")

// Sessions returns how many replication sessions reached streaming (1 +
// successful reconnects).
func (s *Stream) Sessions() int64 { return s.sessions.Load() }

// Run streams events until ctx is done, reconnecting with backoff after
// connection loss or server restarts. It returns nil after ctx is done (the
// last published position is acknowledged first) and a PermanentError only
// for a problem a reconnect cannot fix: wal_level, privileges, the schema,
// the publication, an unusable slot. Run must not be called twice at once.
func (s *Stream) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("events: Stream.Run is already running")
	}
	defer s.running.Store(false)

	var wg sync.WaitGroup
	lagCtx, stopLag := context.WithCancel(ctx)
	wg.Go(func() { s.lagLoop(lagCtx) })
	defer wg.Wait()
	defer stopLag()

	delay := s.cfg.MinBackoff
	for {
		var err error
		var streamedAt time.Time
		// prepare runs before every session: a database replaced behind
		// the stream (schema gone, wal_level changed) ends Run instead of
		// being retried for ever.
		if err = s.prepare(ctx); err == nil {
			err = s.session(ctx, &streamedAt)
		}
		if ctx.Err() != nil {
			return nil
		}
		if IsPermanent(err) {
			return err
		}
		if errors.Is(err, errSlotActive) {
			// Another relay streams this slot: stand by, trying again
			// every MaxBackoff, and take over when it stops.
			if !s.standby.Swap(true) {
				s.log.Info("slot is streaming to another session; standing by until it ends", zap.String("slot", s.cfg.Slot), zap.Error(err))
			}
			select {
			case <-time.After(backoff.Jitter(s.cfg.MaxBackoff)):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		// Only a session that streamed for a while resets the backoff: one
		// that fails right after connecting keeps backing off.
		if !streamedAt.IsZero() && time.Since(streamedAt) >= s.stableAfter() {
			delay = s.cfg.MinBackoff
		}
		s.m.reconnects.Inc()
		wait := backoff.Jitter(delay)
		s.log.Warn("replication stream interrupted; reconnecting", zap.String("slot", s.cfg.Slot), zap.Duration("backoff", wait), zap.Error(err))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
		delay = min(delay*2, s.cfg.MaxBackoff)
	}
}

// stableAfter is how long a session must stream before a failure starts
// the backoff over at MinBackoff: MaxBackoff, at least one second.
func (s *Stream) stableAfter() time.Duration { return max(s.cfg.MaxBackoff, time.Second) }

// prepare checks the server and makes sure the publication exists.
func (s *Stream) prepare(ctx context.Context) error {
	if err := CheckServer(ctx, s.pool, s.replCfg.User); err != nil {
		return err
	}
	return EnsurePublication(ctx, s.pool, s.cfg.Schema, s.cfg.Publication)
}

// CheckServer returns ErrWalLevel when wal_level is not logical and
// ErrNoReplicationPrivilege when role (empty: current_user) can neither
// replicate nor is superuser.
func CheckServer(ctx context.Context, pool *pgxpool.Pool, role string) error {
	var level string
	if err := pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return fmt.Errorf("events: reading wal_level: %w", err)
	}
	if level != "logical" {
		return walLevelError(level)
	}
	var ok bool
	err := pool.QueryRow(ctx, `SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = coalesce(nullif($1, ''), current_user)`, role).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // another role than the pool's; the connection will tell
	}
	if err != nil {
		return fmt.Errorf("events: reading role attributes: %w", err)
	}
	if !ok {
		return PermanentError{fmt.Errorf("%w: role %q can neither replicate nor is superuser; run ALTER ROLE %s REPLICATION as a superuser", ErrNoReplicationPrivilege, role, sqlident.Quote(role))}
	}
	return nil
}

// EnsurePublication creates publication (inserts only) on <schema>.events
// unless it exists, and checks that it covers the table. Creating it needs
// CREATE on the database and ownership of the table (or superuser).
func EnsurePublication(ctx context.Context, pool *pgxpool.Pool, schema, publication string) error {
	if err := sqlident.Validate("publication name", publication, 0); err != nil {
		return PermanentError{fmt.Errorf("%w: %w", ErrInvalidConfig, err)}
	}
	var table *string
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, sqlident.Quote(schema, "events")).Scan(&table); err != nil {
		return fmt.Errorf("events: looking up the events table: %w", err)
	}
	if table == nil {
		return PermanentError{fmt.Errorf("%w: %s", ErrNotMigrated, sqlident.Quote(schema, "events"))}
	}
	create := `CREATE PUBLICATION ` + sqlident.Quote(publication) + ` FOR TABLE ` + sqlident.Quote(schema, "events") + ` WITH (publish = 'insert')`
	var exists, covers, inserts bool
	err := pool.QueryRow(ctx, `
SELECT true, coalesce(p.pubinsert, false), EXISTS (SELECT 1 FROM pg_publication_tables t
	WHERE t.pubname = p.pubname AND t.schemaname = $2 AND t.tablename = 'events')
FROM pg_publication p WHERE p.pubname = $1`, publication, schema).Scan(&exists, &inserts, &covers)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("events: looking up publication %s: %w", publication, err)
	}
	if exists {
		if !covers || !inserts {
			return PermanentError{fmt.Errorf("%w: publication %q exists but does not publish inserts of %s; drop it or pick another name", ErrPublication, publication, sqlident.Quote(schema, "events"))}
		}
		return publicationFilters(ctx, pool, schema, publication)
	}
	if _, err := pool.Exec(ctx, create); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently
			return nil
		}
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return PermanentError{fmt.Errorf("%w: cannot create it (%s); creating a publication needs CREATE on the database and ownership of the table (or superuser); have such a role run: %s", ErrPublication, pgErr.Message, create)}
		}
		return fmt.Errorf("events: %s: %w", create, err)
	}
	return nil
}

// publicationFilters refuses a publication that filters the events table's
// rows (a WHERE) or columns (a column list), PostgreSQL 15's: its filtered
// events were never streamed while the slot moved past them, and a column
// list failed at the first event as if the schema were not migrated
// (TestFilteredPublicationIsRefused).
func publicationFilters(ctx context.Context, pool *pgxpool.Pool, schema, publication string) error {
	var version int
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return fmt.Errorf("events: looking up the server's version: %w", err)
	}
	if version < 150000 {
		return nil // no row filters or column lists before 15
	}
	var filtered bool
	err := pool.QueryRow(ctx, `
SELECT t.rowfilter IS NOT NULL OR NOT (ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a
	WHERE a.attrelid = $3::regclass AND a.attnum > 0 AND NOT a.attisdropped) <@ t.attnames::text[])
FROM pg_catalog.pg_publication_tables t WHERE t.pubname = $1 AND t.schemaname = $2 AND t.tablename = 'events'`,
		publication, schema, sqlident.Quote(schema, "events")).Scan(&filtered)
	if err != nil {
		return fmt.Errorf("events: looking up publication %s: %w", publication, err)
	}
	if filtered {
		return PermanentError{fmt.Errorf("%w: publication %q filters the rows or columns of %s: the events it leaves out would never be streamed; drop it (the stream creates one without filters) or pick another name", ErrPublication, publication, sqlident.Quote(schema, "events"))}
	}
	return nil
}

// txn is one committed transaction's events.
type txn struct {
	events     []Event
	commitLSN  pglogrepl.LSN
	end        pglogrepl.LSN // 0 in a part that is not the last
	commitTime time.Time
	// acked: the transaction committed before the position this stream
	// already acknowledged, so it was published; a server that lost the
	// slot's position in a crash sends it again, and it is skipped.
	acked bool
}

// session runs one replication connection until it fails or ctx is done.
func (s *Stream) session(ctx context.Context, streamedAt *time.Time) error {
	conn, err := pgconn.ConnectConfig(ctx, s.replCfg)
	if err != nil {
		return classify(fmt.Errorf("events: replication connection: %w", err), s.replCfg.User)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	confirmed, err := s.ensureSlot(ctx, conn)
	if err != nil {
		return err
	}
	skipBelow, err := s.resumeSkip(ctx, conn, confirmed)
	if err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + s.cfg.Publication + "'"},
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: "replication slot ... is active for PID ..."
			return fmt.Errorf("%w: %w", errSlotActive, err)
		}
		return classify(fmt.Errorf("events: START_REPLICATION on slot %s: %w", s.cfg.Slot, err), s.replCfg.User)
	}
	*streamedAt = time.Now()
	if s.standby.Swap(false) {
		s.log.Info("the other session ended; taking over the slot", zap.String("slot", s.cfg.Slot))
	}
	s.sessions.Add(1)
	s.publishedTxn.Store(0)
	s.handed.Store(0)
	s.pendingSince.Store(0)
	// The slot's confirmed position is where this session resumes; the
	// in-memory one is 0/0 in a new process.
	s.log.Info("streaming events", zap.String("slot", s.cfg.Slot), zap.Bool("temporary", s.cfg.TemporarySlot),
		zap.String("confirmed_flush_lsn", confirmed.String()))

	sctx, cancel := context.WithCancel(ctx)
	txns := make(chan *txn, 64)
	// pubDone is closed when the publisher has stopped; pubErr is then set.
	pubDone := make(chan struct{})
	var pubErr error
	go func() {
		defer close(pubDone)
		pubErr = s.publishLoop(sctx, txns, &fence{s: s, pid: conn.PID()})
	}()
	r := &reader{s: s, conn: conn, txns: txns, pubDone: pubDone, rels: map[uint32]*relation{}, skipBelow: skipBelow}
	err = r.run(sctx)
	cancel()
	if errors.Is(err, errServerStopping) {
		// The server waits for this connection to end before it shuts
		// down; the publisher may be stuck in a call that outlives it.
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = conn.Close(cctx)
		ccancel()
	}
	if ctx.Err() != nil && !s.awaitPublisher(pubDone) {
		// Stopping, and a Publish that takes no context still blocks
		// (a sink nobody reads): Run returns without it, as documented;
		// what it was publishing is sent again by the next session.
		return nil
	}
	<-pubDone
	if err == nil {
		err = pubErr
	}
	// Acknowledge what was published before leaving, when the connection
	// still works (a clean shutdown).
	if ctx.Err() != nil {
		_ = r.sendStatus(context.Background())
	}
	return err
}

// resumeSkip returns the position below which the session skips what the
// server sends (0: nothing), and records the server the session runs on.
func (s *Stream) resumeSkip(ctx context.Context, conn *pgconn.PgConn, confirmed pglogrepl.LSN) (pglogrepl.LSN, error) {
	// The slot resumes at its confirmed position: a lost connection
	// leaves out what was published and not yet acknowledged, and a crash
	// of PostgreSQL can put it back further (a slot's position is written
	// to disk at checkpoints). What this stream published since would go
	// out again. Skip it, unless it was published from another server or
	// timeline (a failover, a restore) or the server's WAL no longer
	// reaches that far (a restore from a snapshot): those positions may
	// hold other transactions.
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return 0, classify(fmt.Errorf("events: IDENTIFY_SYSTEM: %w", err), s.replCfg.User)
	}
	server := fmt.Sprintf("%s/%d", sys.SystemID, sys.Timeline)
	var skipBelow pglogrepl.LSN
	if done := max(pglogrepl.LSN(s.acked.Load()), pglogrepl.LSN(s.published.Load())); done > confirmed {
		fields := []zap.Field{zap.String("slot", s.cfg.Slot), zap.String("confirmed_flush_lsn", confirmed.String()), zap.String("published", done.String())}
		switch {
		case server != s.ackedOn:
			s.log.Warn("the slot resumes before what this stream published on another server or timeline; publishing from the slot's position", fields...)
		case sys.XLogPos >= done:
			skipBelow = done
			s.log.Info("the slot resumes before what this stream published; skipping that", fields...)
		default:
			s.log.Warn("the server's WAL ends before what this stream published (restored from a snapshot?); publishing from the slot's position",
				append(fields, zap.String("wal_end", sys.XLogPos.String()))...)
		}
	}
	s.ackedOn = server
	return skipBelow, nil
}

// awaitPublisher waits for the publisher of a stopping session, at most
// shutdownGrace and a second more (the publisher's own grace for
// acknowledgements comes first); false if it did not stop
// (TestRunReturnsWhilePublishBlocks).
func (s *Stream) awaitPublisher(pubDone <-chan struct{}) bool {
	t := time.NewTimer(shutdownGrace + time.Second)
	defer t.Stop()
	select {
	case <-pubDone:
		return true
	case <-t.C:
		s.log.Error("the stream's publisher did not return after the stop (a Publish that blocks: is the sink read?); Run returns without it",
			zap.String("slot", s.cfg.Slot))
		return false
	}
}

// ensureSlot creates the slot unless it exists and returns the position
// the session resumes from: the slot's confirmed_flush_lsn, or a new
// slot's consistent point.
func (s *Stream) ensureSlot(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	create := func(temporary bool) (pglogrepl.LSN, error) {
		res, err := pglogrepl.CreateReplicationSlot(ctx, conn, s.cfg.Slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Temporary: temporary, Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
		if err != nil {
			return 0, err
		}
		lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
		if err != nil {
			return 0, fmt.Errorf("events: slot %s: consistent point %q: %w", s.cfg.Slot, res.ConsistentPoint, err)
		}
		return lsn, nil
	}
	if s.cfg.TemporarySlot {
		lsn, err := create(true)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" {
			// A temporary slot of a session that has not ended yet is
			// retried; a persistent slot of that name never goes away
			// (TestTemporarySlotNameTaken).
			if info, ierr := slotInfo(ctx, s.pool, s.cfg.Slot); ierr == nil && info != nil && !info.Temporary {
				return 0, PermanentError{fmt.Errorf("%w: slot %q exists and is not temporary; a stream with TemporarySlot needs a name of its own", ErrSlot, s.cfg.Slot)}
			}
		}
		if err != nil {
			return 0, classify(fmt.Errorf("events: creating temporary slot %s: %w", s.cfg.Slot, err), s.replCfg.User)
		}
		return lsn, nil
	}
	info, err := slotInfo(ctx, s.pool, s.cfg.Slot)
	if err != nil {
		return 0, err
	}
	if info != nil {
		return info.ConfirmedFlush, checkSlot(info, s.replCfg.Database)
	}
	if s.sessions.Load() > 0 {
		// This stream streamed from the slot, which is gone (dropped by
		// hand): a new one would start at the current WAL position and
		// skip what committed since, silently (TestSlotDroppedUnderTheStream).
		return 0, PermanentError{fmt.Errorf("%w: slot %q was dropped while this stream used it; events after LSN %s were not streamed: replay them (pgwake events replay) and start the stream again, which creates a new slot",
			ErrSlot, s.cfg.Slot, pglogrepl.LSN(s.acked.Load()))}
	}
	lsn, err := create(false)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" {
		// Created concurrently.
		if info, err = slotInfo(ctx, s.pool, s.cfg.Slot); err != nil || info == nil {
			return 0, err
		}
		return info.ConfirmedFlush, nil
	}
	if err != nil {
		return 0, classify(fmt.Errorf("events: creating slot %s: %w", s.cfg.Slot, err), s.replCfg.User)
	}
	s.log.Info("created replication slot", zap.String("slot", s.cfg.Slot), zap.String("confirmed_flush_lsn", lsn.String()))
	return lsn, nil
}

func checkSlot(info *SlotInfo, database string) error {
	if info.Plugin != "pgoutput" {
		return PermanentError{fmt.Errorf("%w: slot %q uses plugin %q, not pgoutput; drop it or pick another name", ErrSlot, info.Name, info.Plugin)}
	}
	if database != "" && info.Database != database {
		return PermanentError{fmt.Errorf("%w: slot %q belongs to database %q, not %q", ErrSlot, info.Name, info.Database, database)}
	}
	if info.WALStatus == "lost" {
		return slotLost(info.Name)
	}
	return nil
}

// slotLost is the error of a slot the server invalidated (wal_status lost:
// it fell behind max_slot_wal_keep_size): it can never be read again
// (TestInvalidatedSlotStopsTheStream).
func slotLost(name string) error {
	return PermanentError{fmt.Errorf("%w: slot %q was invalidated by the server (wal_status lost: it fell more than max_slot_wal_keep_size behind); "+
		"the events since its last confirmed position are gone from the WAL: drop it (pgwake events drop-slot) and backfill from the events table (pgwake events replay)", ErrSlot, name)}
}
