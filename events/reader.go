package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"go.uber.org/zap"
)

// relation is a decoded RelationMessage: where each events column sits.
type relation struct {
	isEvents bool
	cols     map[string]int
}

var eventColumns = []string{"id", "job_id", "type", "queue", "kind", "attempt", "at", "data"}

// reader owns the replication connection: it decodes the stream, hands
// committed transactions to the publisher and sends status updates.
type reader struct {
	s       *Stream
	conn    *pgconn.PgConn
	txns    chan<- *txn
	pubDone <-chan struct{} // closed when the publisher stopped
	rels    map[uint32]*relation

	// skipBelow: transactions that committed before it were published by
	// this stream in an earlier session (when the server is the same and
	// its WAL still reaches that far); 0 skips nothing.
	skipBelow pglogrepl.LSN

	cur         *txn          // the open transaction, nil between transactions
	idle        pglogrepl.LSN // keepalive position seen between transactions
	nextStatus  time.Time
	lastStatus  time.Time
	lastAdvance time.Time // last status update that moved the acknowledged position

	// The publisher's progress, for stuckServer: the published count
	// last seen, when it was seen to change, and the next look at the
	// server.
	lastPub    uint64
	progressAt time.Time
	nextProbe  time.Time
}

// stuckProbe is how long the publisher may hold transactions without
// publishing any before the reader asks the server, once per stuckProbe,
// whether it is shutting down (stuckServer).
const stuckProbe = time.Second

// stuckServer returns errServerStopping when the publisher has held
// transactions for stuckProbe without publishing any and the server says
// it is shutting down. A fast shutdown waits for the walsender until the
// stream confirms all it was sent, which a publisher stuck in one Publish
// call (a broker that does not answer) never does; the session ends
// instead and closes its replication connection
// (TestStreamLetsAFastShutdownThrough, "after").
func (r *reader) stuckServer(ctx context.Context, now time.Time) error {
	pub := r.s.publishedTxn.Load()
	if r.s.handed.Load() <= pub || pub != r.lastPub || r.progressAt.IsZero() {
		r.lastPub, r.progressAt = pub, now
		return nil
	}
	if now.Sub(r.progressAt) < stuckProbe || now.Before(r.nextProbe) {
		return nil
	}
	r.nextProbe = now.Add(stuckProbe)
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := r.s.pool.Exec(qctx, `SELECT 1`)
	return serverStopping(err)
}

// ackDelay is the shortest time between two status updates that move the
// acknowledged position (a position published after a quiet spell goes at
// once); status updates are also sent every StatusInterval.
const ackDelay = 50 * time.Millisecond

// inflightPoll is how often the reader, waiting for the server, looks
// whether the publisher has published more while transactions are in
// flight, so a publication is acknowledged within ackDelay+inflightPoll
// even when the server sends nothing.
const inflightPoll = 20 * time.Millisecond

// statusWriteTimeout bounds the write of one status update.
const statusWriteTimeout = 10 * time.Second

// statusDue returns when the next status update is due: at once or after
// ackDelay when there is a new position to acknowledge, at the next poll
// while the publisher holds transactions, else after StatusInterval.
func (r *reader) statusDue(now time.Time) (due time.Time, send bool) {
	due = r.nextStatus
	if r.position() > pglogrepl.LSN(r.s.acked.Load()) {
		if soon := r.lastAdvance.Add(ackDelay); soon.Before(due) {
			due = soon
		}
	} else if r.s.handed.Load() > r.s.publishedTxn.Load() {
		if poll := now.Add(inflightPoll); poll.Before(due) {
			due = poll
		}
	}
	return due, !now.Before(due)
}

func (r *reader) run(ctx context.Context) error {
	r.nextStatus = time.Now().Add(r.s.cfg.StatusInterval)
	// Reads wait until the connection's read deadline, set before each one
	// (a context with that deadline cost a timer and a context watcher per
	// message); a cancelled ctx moves it to the past, which ends a read at
	// once.
	nc := r.conn.Conn()
	stop := context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	for {
		now := time.Now()
		deadline, send := r.statusDue(now)
		if send {
			if err := r.sendStatus(ctx); err != nil {
				return err
			}
			deadline, _ = r.statusDue(time.Now())
		}
		if err := r.stuckServer(ctx, now); err != nil {
			return err
		}
		select {
		case <-r.pubDone:
			return nil // the session's error, if any, is the publisher's
		default:
		}
		if err := nc.SetReadDeadline(deadline); err != nil {
			return fmt.Errorf("events: replication receive: %w", err)
		}
		if ctx.Err() != nil { // cancelled before the deadline was set
			return nil
		}
		raw, err := r.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("events: replication receive: %w", err)
		}
		switch msg := raw.(type) {
		case *pgproto3.ErrorResponse:
			return classify(fmt.Errorf("events: replication: %w", pgconn.ErrorResponseToPgError(msg)), r.s.replCfg.User)
		case *pgproto3.CopyDone:
			return errors.New("events: the server ended the replication stream")
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			if err := r.copyData(ctx, msg.Data); err != nil {
				return err
			}
		}
	}
}

func (r *reader) copyData(ctx context.Context, data []byte) error {
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("events: keepalive: %w", err)
		}
		if r.cur == nil && pkm.ServerWALEnd > r.idle {
			r.idle = pkm.ServerWALEnd
		}
		if pkm.ReplyRequested {
			return r.sendStatus(ctx)
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("events: XLogData: %w", err)
		}
		m, err := parseLogical(xld.WALData)
		if err != nil {
			return err
		}
		return r.logical(ctx, m)
	}
	return nil
}

func (r *reader) logical(ctx context.Context, m pglogrepl.Message) error {
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		rel := &relation{cols: map[string]int{}}
		for i, c := range m.Columns {
			rel.cols[c.Name] = i
		}
		rel.isEvents = m.Namespace == r.s.cfg.Schema && m.RelationName == "events"
		if rel.isEvents {
			for _, c := range eventColumns {
				if _, ok := rel.cols[c]; !ok {
					return PermanentError{fmt.Errorf("events: relation %s.events has no column %q; is the schema migrated?", m.Namespace, c)}
				}
			}
		}
		r.rels[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		// pgoutput sends a transaction only after it committed, so its
		// commit LSN (FinalLSN) is known from the start.
		r.cur = &txn{commitLSN: m.FinalLSN, commitTime: m.CommitTime}
		// skipBelow is the end of a published transaction (or a
		// keepalive position with everything before it published): a
		// transaction that committed before it was published by this
		// stream. The server sends it again after a lost connection (it
		// was not yet acknowledged) or a crash of PostgreSQL (the slot
		// resumes where the last checkpoint left it)
		// (TestDatabaseCrashUnderFullLoad).
		r.cur.acked = m.FinalLSN < r.skipBelow
	case *pglogrepl.InsertMessage:
		rel := r.rels[m.RelationID]
		if rel == nil {
			return fmt.Errorf("events: insert into unknown relation %d (no RelationMessage)", m.RelationID)
		}
		if !rel.isEvents || r.cur == nil || r.cur.acked {
			return nil
		}
		e, err := r.decode(rel, m.Tuple)
		if err != nil {
			// One bad row must not stop the stream for ever: every
			// reconnect would meet it again.
			r.s.skip(e.ID, "decode", err)
			return nil
		}
		r.cur.events = append(r.cur.events, e)
		if len(r.cur.events) >= r.s.cfg.MaxBatch {
			// A large transaction goes out in parts of MaxBatch events, so
			// memory does not grow with it; only its last part (at
			// Commit) lets the position advance.
			part := r.cur
			r.cur = &txn{commitLSN: part.commitLSN, commitTime: part.commitTime}
			return r.hand(ctx, part)
		}
	case *pglogrepl.CommitMessage:
		t := r.cur
		r.cur = nil
		if t == nil {
			return nil
		}
		if t.acked {
			return nil
		}
		t.commitLSN, t.end, t.commitTime = m.CommitLSN, m.TransactionEndLSN, m.CommitTime
		return r.hand(ctx, t)
	}
	return nil
}

// hand gives t to the publisher, keeping the connection alive with status
// updates while the publisher is busy.
func (r *reader) hand(ctx context.Context, t *txn) error {
	// Counted first, so the publisher never sees fewer handed than it
	// published.
	r.s.handed.Add(1)
	r.s.pendingSince.CompareAndSwap(0, t.commitTime.UnixNano())
	select {
	case r.txns <- t: // the usual case: room in the channel
		return nil
	default:
	}
	for {
		due, send := r.statusDue(time.Now())
		if send {
			if err := r.sendStatus(ctx); err != nil {
				return err
			}
			due, _ = r.statusDue(time.Now())
		}
		if err := r.stuckServer(ctx, time.Now()); err != nil {
			return err
		}
		timer := time.NewTimer(time.Until(due))
		select {
		case r.txns <- t:
			timer.Stop()
			return nil
		case <-timer.C:
		case <-r.pubDone:
			timer.Stop()
			return nil
		case <-ctx.Done():
			timer.Stop()
			return nil
		}
	}
}

// position is what may be acknowledged: the end of the last published
// transaction, or the keepalive position when every handed transaction is
// published and none is open.
func (r *reader) position() pglogrepl.LSN {
	pos := pglogrepl.LSN(r.s.published.Load())
	if r.cur == nil && r.s.handed.Load() == r.s.publishedTxn.Load() && r.idle > pos {
		pos = r.idle
	}
	if acked := pglogrepl.LSN(r.s.acked.Load()); acked > pos {
		pos = acked
	}
	return pos
}

func (r *reader) sendStatus(ctx context.Context) error {
	pos := r.position()
	// The write must not block forever on a connection that went silent.
	_ = r.conn.Conn().SetWriteDeadline(time.Now().Add(statusWriteTimeout))
	err := pglogrepl.SendStandbyStatusUpdate(ctx, r.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos})
	_ = r.conn.Conn().SetWriteDeadline(time.Time{})
	r.lastStatus = time.Now()
	r.nextStatus = r.lastStatus.Add(r.s.cfg.StatusInterval)
	if err != nil {
		return fmt.Errorf("events: standby status update: %w", err)
	}
	if uint64(pos) > r.s.acked.Load() {
		r.lastAdvance = r.lastStatus
		r.s.acked.Store(uint64(pos))
		r.s.log.Debug("acknowledged", zap.String("lsn", pos.String()))
	}
	return nil
}

// decode turns an insert into the events table into an Event. On error
// the Event carries the id when it could be read.
func (r *reader) decode(rel *relation, tup *pglogrepl.TupleData) (Event, error) {
	col := func(name string) ([]byte, error) {
		i := rel.cols[name]
		if tup == nil || i >= len(tup.Columns) {
			return nil, fmt.Errorf("events: insert lacks column %q", name)
		}
		c := tup.Columns[i]
		if c.DataType != pglogrepl.TupleDataTypeText {
			return nil, fmt.Errorf("events: column %q arrived as %q, want text", name, c.DataType)
		}
		return c.Data, nil
	}
	var e Event
	var err error
	var b []byte
	intCol := func(name string) int64 {
		if err != nil {
			return 0
		}
		if b, err = col(name); err != nil {
			return 0
		}
		var v int64
		v, err = strconv.ParseInt(string(b), 10, 64)
		return v
	}
	strCol := func(name string) string {
		if err != nil {
			return ""
		}
		b, err = col(name)
		return string(b)
	}
	e.ID = intCol("id")
	e.JobID = intCol("job_id")
	e.Attempt = int(intCol("attempt"))
	e.Type = Type(strCol("type"))
	e.Queue = strCol("queue")
	e.Kind = strCol("kind")
	at := strCol("at")
	raw := strCol("data")
	if err != nil {
		return Event{ID: e.ID}, err
	}
	var ts pgtype.Timestamptz
	if err := r.s.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, []byte(at), &ts); err != nil {
		return Event{ID: e.ID}, fmt.Errorf("events: event %d: at %q: %w", e.ID, at, err)
	}
	e.At = ts.Time.UTC()
	if err := e.setData([]byte(raw)); err != nil {
		return Event{ID: e.ID}, err
	}
	return e, nil
}

// parseLogical decodes one pgoutput message. pglogrepl trusts the server
// and indexes without bounds checks; a malformed message (a broken proxy, a
// bug) becomes an error that ends the session instead of a panic.
func parseLogical(data []byte) (m pglogrepl.Message, err error) {
	if len(data) == 0 {
		return nil, errors.New("events: empty pgoutput message")
	}
	defer func() {
		if p := recover(); p != nil {
			m, err = nil, fmt.Errorf("events: malformed pgoutput message %q: %v", data[0], p)
		}
	}()
	m, err = pglogrepl.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("events: pgoutput message: %w", err)
	}
	return m, nil
}
