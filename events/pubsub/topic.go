package pubsub

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxTopicLen and MaxGroupLen bound topic and consumer group names, in bytes.
const (
	MaxTopicLen = 255
	MaxGroupLen = 255
)

// ErrInvalidTopic is wrapped by the error for a topic that cannot be used:
// empty, longer than MaxTopicLen bytes, not valid UTF-8, or containing a
// control character (NUL included: PostgreSQL text cannot hold it).
var ErrInvalidTopic = errors.New("invalid topic")

// ErrInvalidGroup is wrapped by the error for a consumer group name that
// cannot be used: longer than MaxGroupLen bytes, not valid UTF-8, or
// containing a control character. The empty group is the default group.
var ErrInvalidGroup = errors.New("invalid consumer group")

// ValidateTopic checks a topic name. Every topic it accepts maps to a queue
// (see QueueName); quotes, semicolons, spaces, upper case and non-ASCII
// letters are all accepted and never reach SQL text.
func ValidateTopic(topic string) error {
	if topic == "" {
		return fmt.Errorf("%w: empty", ErrInvalidTopic)
	}
	return validateName(ErrInvalidTopic, topic, MaxTopicLen)
}

// ValidateGroup checks a consumer group name; "" (the default group) is valid.
func ValidateGroup(group string) error {
	if group == "" {
		return nil
	}
	return validateName(ErrInvalidGroup, group, MaxGroupLen)
}

func validateName(sentinel error, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%w: %.40q... is %d bytes, the limit is %d", sentinel, s, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %q is not valid UTF-8", sentinel, s)
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %q has control character %U at byte %d", sentinel, s, r, i)
		}
	}
	return nil
}

// Lengths of the parts of a queue name.
const (
	queuePrefix   = "wm"
	topicPartLen  = 24
	groupPartLen  = 12
	hashPartBytes = 8 // 16 hex digits
)

// QueueName returns the pgwake queue that holds the messages of topic for
// consumer group group ("" is the default group). The rule, which never
// changes for a given pair:
//
//	"wm." + readable(topic, 24) [+ "." + readable(group, 12)] + "." + hex(sha256(topic + "\x00" + group))[:16]
//
// readable lowercases ASCII letters, keeps [a-z0-9_-], turns every other run
// of bytes into one '_', trims '_' and '-' at both ends and cuts to the given
// length; it is omitted when empty. The result is at most 57 bytes of
// [a-z0-9_.-], a valid queue name. The hash makes names that differ only in
// case or in replaced characters map to different queues; a hash collision is
// refused when the second pair registers (the queue column is unique).
func QueueName(topic, group string) (string, error) {
	if err := ValidateTopic(topic); err != nil {
		return "", err
	}
	if err := ValidateGroup(group); err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(topic + "\x00" + group))
	parts := []string{queuePrefix}
	if r := readable(topic, topicPartLen); r != "" {
		parts = append(parts, r)
	}
	if r := readable(group, groupPartLen); r != "" {
		parts = append(parts, r)
	}
	parts = append(parts, hex.EncodeToString(sum[:hashPartBytes]))
	return strings.Join(parts, "."), nil
}

func readable(s string, max int) string {
	var b strings.Builder
	under := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' {
			b.WriteByte(c)
			under = c == '_'
			continue
		}
		if !under {
			b.WriteByte('_')
			under = true
		}
	}
	out := strings.Trim(b.String(), "_-")
	if len(out) > max {
		out = strings.TrimRight(out[:max], "_-")
	}
	return out
}
