// Package jsonenc appends JSON the way encoding/json writes it, without
// reflection or an intermediate buffer, for the hot encoders of the event
// stream (events.Encode) and the dashboard's feed (ui).
package jsonenc

import (
	"encoding/json"
	"strconv"
)

// String appends s as encoding/json writes it: a string of printable ASCII
// without a quote, backslash, '<', '>' or '&' as it is, any other through
// encoding/json (its escaping of HTML characters, control characters,
// invalid UTF-8 and U+2028/U+2029).
func String(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// EventFields appends the fields an event of the log has in both
// encodings, after an opening brace or a field of the caller's:
// "id", "job_id", "type", "queue", "kind", "attempt", in that order.
// first says whether no field precedes them.
func EventFields(b []byte, first bool, id, jobID int64, typ, queue, kind string, attempt int) []byte {
	if !first {
		b = append(b, ',')
	}
	b = append(b, `"id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"job_id":`...)
	b = strconv.AppendInt(b, jobID, 10)
	b = append(b, `,"type":`...)
	b = String(b, typ)
	b = append(b, `,"queue":`...)
	b = String(b, queue)
	b = append(b, `,"kind":`...)
	b = String(b, kind)
	b = append(b, `,"attempt":`...)
	return strconv.AppendInt(b, int64(attempt), 10)
}
