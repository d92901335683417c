package pubsub

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Kind is the job kind of every message job.
const Kind = "watermill.message"

// envelopeVersion is the "v" of the job payload written by this version.
const envelopeVersion = 1

// envelope is a message as stored in a job's JSON payload:
//
//	{"v":1,"topic":"...","uuid":"...","metadata":{"k":"v"},"payload_b64":"..."}
//
// payload_b64 is the standard base64 of the payload bytes (null for a nil
// payload, "" for an empty one).
type envelope struct {
	V        int               `json:"v"`
	Topic    string            `json:"topic"`
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata"`
	Payload  []byte            `json:"payload_b64"`
}

// ErrInvalidMessage is wrapped by the error for a message that cannot be
// stored exactly: nil, or a UUID or metadata key or value that is not valid
// UTF-8 or contains NUL (JSON would alter the first, jsonb refuses the
// second). Nothing is written when Publish returns it.
var ErrInvalidMessage = errors.New("message cannot be stored")

// MessageError reports which message of a Publish call was rejected.
type MessageError struct {
	// Index is the message's position in the Publish arguments.
	Index int
	// UUID is the message's UUID ("" for a nil message).
	UUID string
	Err  error
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("pubsub: message %d (uuid %.40q): %v", e.Index, e.UUID, e.Err)
}

func (e *MessageError) Unwrap() error { return e.Err }

// encode returns the job payload of msg.
func encode(i int, topic string, msg *message.Message) ([]byte, error) {
	if msg == nil {
		return nil, &MessageError{Index: i, Err: fmt.Errorf("%w: nil message", ErrInvalidMessage)}
	}
	bad := func(what, s string) error {
		return &MessageError{Index: i, UUID: msg.UUID, Err: fmt.Errorf("%w: %s %.40q must be valid UTF-8 without NUL", ErrInvalidMessage, what, s)}
	}
	if !storable(msg.UUID) {
		return nil, bad("uuid", msg.UUID)
	}
	for k, v := range msg.Metadata {
		if !storable(k) {
			return nil, bad("metadata key", k)
		}
		if !storable(v) {
			return nil, bad("metadata value of "+k, v)
		}
	}
	md := msg.Metadata
	if md == nil {
		md = map[string]string{}
	}
	b, err := json.Marshal(envelope{V: envelopeVersion, Topic: topic, UUID: msg.UUID, Metadata: md, Payload: msg.Payload})
	if err != nil {
		return nil, &MessageError{Index: i, UUID: msg.UUID, Err: fmt.Errorf("%w: %w", ErrInvalidMessage, err)}
	}
	return b, nil
}

func storable(s string) bool { return utf8.ValidString(s) && !strings.Contains(s, "\x00") }

// ErrBadEnvelope is wrapped by the error for a claimed job whose payload is
// not a message written by this package. Such a job fails its attempt.
var ErrBadEnvelope = errors.New("job payload is not a pgwake watermill message")

// decode turns a job payload back into a message.
func decode(payload []byte) (*message.Message, error) {
	var e envelope
	if err := json.Unmarshal(payload, &e); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadEnvelope, err)
	}
	if e.V != envelopeVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", ErrBadEnvelope, e.V, envelopeVersion)
	}
	msg := message.NewMessage(e.UUID, e.Payload)
	for k, v := range e.Metadata {
		msg.Metadata[k] = v
	}
	return msg, nil
}
