package pubsub

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/pgwake/pgwake/queue"
)

// FuzzQueueName: every accepted (topic, group) maps to a valid queue name,
// the same one every time; rejected input wraps the right sentinel.
func FuzzQueueName(f *testing.F) {
	for _, s := range []string{"orders", "Orders", "'; DROP TABLE x; --", "заказы", "a\x00b", "", strings.Repeat("x", 300), "\xff", "_-_", "..."} {
		f.Add(s, "")
		f.Add(s, "Group 'g'")
	}
	f.Fuzz(func(t *testing.T, topic, group string) {
		q, err := QueueName(topic, group)
		if err != nil {
			if !errors.Is(err, ErrInvalidTopic) && !errors.Is(err, ErrInvalidGroup) {
				t.Fatalf("QueueName(%q, %q): unexpected error %v", topic, group, err)
			}
			return
		}
		if err := queue.ValidateQueue(q); err != nil {
			t.Fatalf("QueueName(%q, %q) = %q: %v", topic, group, q, err)
		}
		if again, _ := QueueName(topic, group); again != q {
			t.Fatalf("QueueName(%q, %q) not deterministic: %q then %q", topic, group, q, again)
		}
	})
}

// FuzzEnvelope: a message that encode accepts comes back from decode
// exactly; decode never panics on arbitrary bytes.
func FuzzEnvelope(f *testing.F) {
	f.Add("uuid", "k", "v", []byte("payload"), true)
	f.Add("", "", "", []byte{}, false)
	f.Add("u\x00", "k", "\xff", []byte{0, 1, 2, 255}, true)
	f.Fuzz(func(t *testing.T, uuid, key, value string, payload []byte, nilPayload bool) {
		if nilPayload {
			payload = nil
		}
		m := message.NewMessage(uuid, payload)
		m.Metadata.Set(key, value)
		b, err := encode(0, "topic", m)
		if err != nil {
			if !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("encode: unexpected error %v", err)
			}
			return
		}
		if !json.Valid(b) {
			t.Fatalf("encode produced invalid JSON: %s", b)
		}
		got, err := decode(b)
		if err != nil {
			t.Fatalf("decode(encode): %v", err)
		}
		if got.UUID != uuid || got.Metadata.Get(key) != value || len(got.Metadata) != 1 ||
			!bytes.Equal(got.Payload, payload) || (got.Payload == nil) != (payload == nil) {
			t.Fatalf("round trip changed the message: %+v -> %+v", m, got)
		}
		_, _ = decode(payload) // arbitrary bytes: error or message, no panic
	})
}
