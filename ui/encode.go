package ui

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/pgwake/pgwake/queue"
)

// appendJobFrame appends the "job" server-sent event of e, with id, to b:
// the frame appendFrame writes for jobEventOf(e) encoded by encoding/json,
// byte for byte (TestJobEventEncodingMatchesJSON), without reflection or
// an intermediate buffer. The feed writes one per event of the log.
func appendJobFrame(b []byte, id int64, e queue.EventInfo) []byte {
	b = append(b, "id: "...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, "\nevent: job\ndata: "...)
	b = appendJobEvent(b, e)
	return append(b, "\n\n"...)
}

// appendJobEvent appends jobEventOf(e) as encoding/json encodes it.
func appendJobEvent(b []byte, e queue.EventInfo) []byte {
	if y := e.At.Year(); y < 0 || y > 9999 {
		// Outside what JSON times allow: whatever encoding/json does.
		data, _ := json.Marshal(jobEventOf(e))
		return append(b, data...)
	}
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, e.ID, 10)
	b = append(b, `,"job_id":`...)
	b = strconv.AppendInt(b, e.JobID, 10)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, string(e.Type))
	b = append(b, `,"queue":`...)
	b = appendJSONString(b, e.Queue)
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, e.Kind)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(e.Attempt), 10)
	b = append(b, `,"at":"`...)
	b = e.At.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}

// appendJSONString appends s as a JSON string the way encoding/json
// writes it: printable ASCII other than the quote, the backslash and the
// HTML-sensitive <, > and & is copied; a string with anything else is
// left to encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			data, _ := json.Marshal(s)
			return append(b, data...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
