package events

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"go.uber.org/zap"
)

// pgoutput message builders for the seeds.

func pgString(b []byte, s string) []byte { return append(append(b, s...), 0) }

func relationMsg(relID uint32, schema, table string, cols []string) []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, relID)
	b = pgString(b, schema)
	b = pgString(b, table)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, 0)
		b = pgString(b, c)
		b = binary.BigEndian.AppendUint32(b, 25) // text
		b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	}
	return b
}

func beginMsg() []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, 0x100)
	b = binary.BigEndian.AppendUint64(b, 1000)
	return binary.BigEndian.AppendUint32(b, 7)
}

func insertMsg(relID uint32, vals []string) []byte {
	b := []byte{'I'}
	b = binary.BigEndian.AppendUint32(b, relID)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for _, v := range vals {
		if v == "\x00null" {
			b = append(b, 'n')
			continue
		}
		b = append(b, 't')
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

func commitMsg() []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, 0x100)
	b = binary.BigEndian.AppendUint64(b, 0x180)
	return binary.BigEndian.AppendUint64(b, 1000)
}

// xlog wraps a pgoutput message in an XLogData CopyData payload.
func xlog(m []byte) []byte {
	b := []byte{'w'}
	b = binary.BigEndian.AppendUint64(b, 0x100)
	b = binary.BigEndian.AppendUint64(b, 0x180)
	b = binary.BigEndian.AppendUint64(b, 1000)
	return append(b, m...)
}

// frames joins CopyData payloads, each behind a 2-byte length.
func frames(ms ...[]byte) []byte {
	var b []byte
	for _, m := range ms {
		b = binary.BigEndian.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	return b
}

func fuzzReader() (*reader, chan *txn) {
	txns := make(chan *txn, 1024)
	s := &Stream{cfg: Config{Schema: "pgwake"}.withDefaults(), log: zap.NewNop(), types: pgtype.NewMap()}
	s.m, _ = newMetrics(nil, "fuzz", func() float64 { return 0 }, func() float64 { return 0 })
	return &reader{s: s, txns: txns, rels: map[uint32]*relation{}, nextStatus: time.Now().Add(time.Hour)}, txns
}

// FuzzReplicationStream feeds arbitrary replication CopyData frames (the
// bytes a server, or anything in between, sends) to the stream's decoder:
// it returns errors (or skips an undecodable row), never panics, and every
// event it hands on decoded.
func FuzzReplicationStream(f *testing.F) {
	cols := eventColumns
	good := []string{"42", "7", "retry_scheduled", "default", "email", "1", "2026-11-29 14:00:00.5+00", `{"error": "smtp: timeout", "run_after": "2026-11-29T14:00:30Z"}`}
	f.Add(frames(xlog(relationMsg(1, "pgwake", "events", cols)), xlog(beginMsg()), xlog(insertMsg(1, good)), xlog(commitMsg())))
	f.Add(frames(xlog(relationMsg(1, "pgwake", "events", cols)), xlog(beginMsg()),
		xlog(insertMsg(1, []string{"x", "7", "t", "q", "k", "1", "not a time", "{"})), xlog(commitMsg())))
	f.Add(frames(xlog(relationMsg(1, "pgwake", "events", cols)), xlog(beginMsg()),
		xlog(insertMsg(1, []string{"1", "\x00null", "t", "q", "k", "1", "2026-01-01 00:00:00+00", "{}"})), xlog(commitMsg())))
	f.Add(frames(xlog(relationMsg(1, "pgwake", "events", cols[:3])), xlog(beginMsg()), xlog(insertMsg(1, good[:2])), xlog(commitMsg())))
	f.Add(frames(xlog(relationMsg(2, "other", "events", cols)), xlog(beginMsg()), xlog(insertMsg(2, good)), xlog(insertMsg(9, good)), xlog(commitMsg())))
	f.Add(frames(xlog(beginMsg()), xlog(insertMsg(1, good)), xlog(commitMsg()), xlog(commitMsg())))
	f.Add(frames([]byte{'k', 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, []byte{'w', 1}, []byte{'?'}))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, txns := fuzzReader()
		ctx := context.Background()
		for len(in) >= 2 {
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			if n > len(in) {
				n = len(in)
			}
			data := in[:n]
			in = in[n:]
			if len(data) == 0 {
				continue // the reader skips empty CopyData
			}
			if data[0] == 'k' && len(data) > 17 && data[17] != 0 {
				continue // a keepalive asking for a reply needs a connection
			}
			if len(txns) == cap(txns) {
				return
			}
			if err := r.copyData(ctx, data); err != nil {
				return // an error ends the session; that is the contract
			}
		}
		close(txns)
		for tx := range txns {
			for _, e := range tx.events {
				if e.At.IsZero() {
					t.Fatalf("handed on an event without a time: %+v", e)
				}
			}
		}
	})
}
