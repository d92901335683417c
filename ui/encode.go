package ui

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/pgwake/pgwake/internal/jsonenc"
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
	b = append(b, '{')
	b = jsonenc.EventFields(b, true, e.ID, e.JobID, string(e.Type), e.Queue, e.Kind, e.Attempt)
	b = append(b, `,"at":"`...)
	b = e.At.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}
