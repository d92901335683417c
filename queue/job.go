package queue

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode"
	"unicode/utf8"
)

// DefaultQueue is the queue of a job that names none.
const DefaultQueue = "default"

// MaxQueueLen and MaxKindLen bound queue and kind names, in bytes.
const (
	MaxQueueLen = 63
	MaxKindLen  = 255
)

// Sentinel errors for bad input. Validation errors wrap one of these in a
// *JobError; test with errors.Is.
var (
	ErrInvalidQueue       = errors.New("invalid queue name")
	ErrInvalidKind        = errors.New("invalid kind")
	ErrInvalidPayload     = errors.New("payload is not valid JSON")
	ErrPayloadTooLarge    = errors.New("payload too large")
	ErrInvalidMaxAttempts = errors.New("max attempts must be at least 1")
	ErrInvalidPriority    = errors.New("priority out of range")
	ErrInvalidSchedule    = errors.New("invalid schedule")
	ErrInvalidUniqueKey   = errors.New("invalid unique key")
	ErrInvalidMetadata    = errors.New("invalid metadata")
)

// JobError reports which job of an enqueue call was rejected and why. Nothing
// is written when an enqueue call returns one.
type JobError struct {
	// Index is the job's position in the EnqueueMany slice (0 for Enqueue).
	Index int
	// Field names the offending field: "queue", "kind", "payload", ...
	Field string
	Err   error
}

func (e *JobError) Error() string {
	return fmt.Sprintf("job %d: %s: %v", e.Index, e.Field, e.Err)
}

func (e *JobError) Unwrap() error { return e.Err }

// NewJob is a job to enqueue.
type NewJob struct {
	// Queue names the queue; default DefaultQueue. Lowercase letters, digits,
	// '_', '.', '-'; 1 to 63 bytes; starts with a letter or digit.
	Queue string
	// Kind selects the handler. Required, 1 to 255 bytes of printable UTF-8.
	Kind string
	// Payload is the job's arguments. []byte and json.RawMessage must hold
	// valid JSON; anything else is encoded with encoding/json. Nil means {}.
	Payload any
	// Priority orders due jobs: lower runs first. Default 0; -32768..32767.
	Priority int
	// RunAfter makes the job due at that time. Zero means now (the database's
	// clock), plus Delay.
	RunAfter time.Time
	// Delay makes the job due Delay after the enqueue. Ignored when RunAfter
	// is set; must not be negative.
	Delay time.Duration
	// MaxAttempts is how many times the job may run before it is marked
	// failed. Default Config.MaxAttempts (5); 1 to math.MaxInt32.
	MaxAttempts int
	// UniqueKey, when set, makes a second enqueue with the same key, in the
	// same scope, while the key is held return the holder's id and write
	// nothing (docs/unique.md). By default a key is scoped by kind and held
	// while its job is pending or running.
	UniqueKey string
	// UniqueScope is what the key is unique within: UniqueByKind (default)
	// or UniqueByQueue.
	UniqueScope UniqueScope
	// UniqueHold is which jobs hold the key: UniqueHoldActive (default),
	// UniqueHoldPending or UniqueHoldSucceeded. Not with UniquePeriod.
	UniqueHold UniqueHold
	// UniquePeriod, when positive, holds the key for that long from the
	// enqueue whatever becomes of the job (debounce: at most one job per
	// period); EnqueueResult.HeldUntil says until when. From one
	// microsecond to under 36,000 days (ErrInvalidUniqueKey otherwise).
	UniquePeriod time.Duration
	// Metadata is handed to the handler with the job (Job.Metadata), e.g. a
	// trace context that Config.Hooks set. Nil or empty stores nothing. At
	// most Config.MaxPayloadBytes as a JSON object (ErrInvalidMetadata).
	Metadata map[string]string
}

// UniqueScope is what a unique key is unique within.
type UniqueScope string

// Unique key scopes.
const (
	UniqueByKind  UniqueScope = "kind"  // the default: jobs of the same kind
	UniqueByQueue UniqueScope = "queue" // jobs of the same queue, whatever their kind
)

// UniqueHold says which jobs hold a unique key.
type UniqueHold string

// Unique key holds.
const (
	// UniqueHoldActive, the default: a pending or running job holds its key.
	UniqueHoldActive UniqueHold = "active"
	// UniqueHoldPending: a pending job holds its key until its first attempt
	// starts (leased mode) or ends (held mode, whose claim commits with the
	// outcome); a job waiting for a retry no longer holds it.
	UniqueHoldPending UniqueHold = "pending"
	// UniqueHoldSucceeded: pending, running and succeeded jobs hold it; a
	// succeeded job keeps it until retention deletes the job. A failed or
	// cancelled job frees it.
	UniqueHoldSucceeded UniqueHold = "succeeded"
	// UniqueHoldPeriod is what JobInfo reports for a job enqueued with a
	// UniquePeriod (its key is held for the period). It is not a
	// NewJob.UniqueHold: set UniquePeriod instead.
	UniqueHoldPeriod UniqueHold = "period"
)

// EnqueueResult is the outcome of enqueuing one job.
type EnqueueResult struct {
	ID int64
	// Duplicate is true when UniqueKey was held; ID is the holder's id and
	// nothing was written.
	Duplicate bool
	// HeldUntil is, for a duplicate whose key is held for a UniquePeriod,
	// when that period ends; zero otherwise.
	HeldUntil time.Time
}

// Job is a claimed job, as a handler sees it.
type Job struct {
	ID       int64
	Queue    string
	Kind     string
	Payload  json.RawMessage
	Priority int
	// Attempt is this attempt's number, starting at 1.
	Attempt     int
	MaxAttempts int
	RunAfter    time.Time
	CreatedAt   time.Time
	UniqueKey   string
	// LastError is the previous attempt's error, if any.
	LastError string
	// Metadata is NewJob.Metadata as enqueued (nil when none).
	Metadata map[string]string
}

// ValidateQueue checks a queue name.
func ValidateQueue(q string) error {
	if q == "" {
		return fmt.Errorf("%w: empty", ErrInvalidQueue)
	}
	if len(q) > MaxQueueLen {
		return fmt.Errorf("%w: %.80q is %d bytes, the limit is %d", ErrInvalidQueue, q, len(q), MaxQueueLen)
	}
	for i := 0; i < len(q); i++ {
		c := q[i]
		ok := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && (c == '_' || c == '.' || c == '-'))
		if !ok {
			return fmt.Errorf("%w: %q has %q at byte %d; use lowercase letters, digits, '_', '.', '-', starting with a letter or digit", ErrInvalidQueue, q, c, i)
		}
	}
	return nil
}

// ValidateKind checks a kind name.
func ValidateKind(k string) error {
	if k == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKind)
	}
	if len(k) > MaxKindLen {
		return fmt.Errorf("%w: %.80q... is %d bytes, the limit is %d", ErrInvalidKind, k, len(k), MaxKindLen)
	}
	if !utf8.ValidString(k) {
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidKind, k)
	}
	for _, r := range k {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("%w: %q contains %U; use printable characters without spaces", ErrInvalidKind, k, r)
		}
	}
	return nil
}

// prepared is a validated NewJob in column form.
type prepared struct {
	queue, kind string
	payload     []byte
	priority    int16
	runAfter    *time.Time // nil: now() + delay
	delayMicros int64
	maxAttempts int32
	uniqueKey   *string
	// The key's scope, hold and period; nil for the defaults.
	uniqueScope, uniqueHold *string
	uniquePeriod            *time.Duration
	metadata                []byte // JSON object; nil: none
}

func (c *Client) prepare(i int, j NewJob) (prepared, error) {
	fail := func(field string, err error) (prepared, error) {
		return prepared{}, &JobError{Index: i, Field: field, Err: err}
	}
	p := prepared{queue: j.Queue, kind: j.Kind}
	if p.queue == "" {
		p.queue = DefaultQueue
	}
	if err := ValidateQueue(p.queue); err != nil {
		return fail("queue", err)
	}
	if err := ValidateKind(p.kind); err != nil {
		return fail("kind", err)
	}
	payload, err := encodePayload(j.Payload, c.cfg.MaxPayloadBytes)
	if err != nil {
		return fail("payload", err)
	}
	p.payload = payload
	if j.Priority < math.MinInt16 || j.Priority > math.MaxInt16 {
		return fail("priority", fmt.Errorf("%w: %d is outside %d..%d", ErrInvalidPriority, j.Priority, math.MinInt16, math.MaxInt16))
	}
	p.priority = int16(j.Priority)
	switch {
	case !j.RunAfter.IsZero():
		if y := j.RunAfter.UTC().Year(); y < 1 || y > 9999 { // in UTC, as the SQL API checks it (migration 0023)
			return fail("run_after", fmt.Errorf("%w: run_after %s is outside years 1..9999 (UTC)", ErrInvalidSchedule, j.RunAfter))
		}
		t := j.RunAfter
		p.runAfter = &t
	case j.Delay < 0:
		return fail("delay", fmt.Errorf("%w: negative delay %s", ErrInvalidSchedule, j.Delay))
	default:
		p.delayMicros = j.Delay.Microseconds()
	}
	ma := j.MaxAttempts
	if ma == 0 {
		ma = c.cfg.MaxAttempts
	}
	if ma < 1 {
		return fail("max_attempts", fmt.Errorf("%w: got %d", ErrInvalidMaxAttempts, ma))
	}
	if ma > math.MaxInt32 {
		return fail("max_attempts", fmt.Errorf("%w: got %d, the limit is %d", ErrInvalidMaxAttempts, ma, math.MaxInt32))
	}
	p.maxAttempts = int32(ma)
	if j.UniqueKey != "" {
		if len(j.UniqueKey) > 1024 || !utf8.ValidString(j.UniqueKey) || containsNUL(j.UniqueKey) {
			return fail("unique_key", fmt.Errorf("%w: must be valid UTF-8 without NUL, at most 1024 bytes", ErrInvalidUniqueKey))
		}
		uk := j.UniqueKey
		p.uniqueKey = &uk
	}
	if len(j.Metadata) > 0 {
		// encoding/json would turn invalid UTF-8 into U+FFFD (the handler
		// would get other strings), and jsonb refuses NUL.
		for k, v := range j.Metadata {
			if !utf8.ValidString(k) || !utf8.ValidString(v) || containsNUL(k) || containsNUL(v) {
				return fail("metadata", fmt.Errorf("%w: key %.80q or its value is not valid UTF-8 or contains NUL", ErrInvalidMetadata, k))
			}
		}
		if p.metadata, err = json.Marshal(j.Metadata); err != nil {
			return fail("metadata", fmt.Errorf("%w: %w", ErrInvalidMetadata, err))
		}
		if len(p.metadata) > c.cfg.MaxPayloadBytes {
			// The row and its enqueued event carry it as they do the
			// payload: the payload's limit bounds it too.
			return fail("metadata", fmt.Errorf("%w: %d bytes as JSON, the limit is %d (Config.MaxPayloadBytes)", ErrInvalidMetadata, len(p.metadata), c.cfg.MaxPayloadBytes))
		}
	}
	return prepareUnique(p, j, fail)
}

// maxUniquePeriod is the SQL side's bound on a unique period, interval
// '100 years', which PostgreSQL compares as 36,000 days.
const maxUniquePeriod = 36000 * 24 * time.Hour

// prepareUnique checks a job's unique scope, hold and period.
func prepareUnique(p prepared, j NewJob, fail func(string, error) (prepared, error)) (prepared, error) {
	if j.UniqueScope == "" && j.UniqueHold == "" && j.UniquePeriod == 0 {
		return p, nil
	}
	if j.UniqueKey == "" {
		return fail("unique_key", fmt.Errorf("%w: a unique scope, hold or period needs a unique key", ErrInvalidUniqueKey))
	}
	switch j.UniqueScope {
	case "", UniqueByKind:
	case UniqueByQueue:
		s := string(UniqueByQueue)
		p.uniqueScope = &s
	default:
		return fail("unique_scope", fmt.Errorf("%w: scope %q: use %q or %q", ErrInvalidUniqueKey, j.UniqueScope, UniqueByKind, UniqueByQueue))
	}
	switch {
	case j.UniquePeriod < 0:
		return fail("unique_period", fmt.Errorf("%w: negative period %s", ErrInvalidUniqueKey, j.UniquePeriod))
	case j.UniquePeriod > 0 && j.UniquePeriod < time.Microsecond:
		// PostgreSQL's intervals count microseconds: less is 0, which the
		// SQL side refuses.
		return fail("unique_period", fmt.Errorf("%w: period %s is under a microsecond", ErrInvalidUniqueKey, j.UniquePeriod))
	case j.UniquePeriod >= maxUniquePeriod:
		return fail("unique_period", fmt.Errorf("%w: period %s is not under 36,000 days (PostgreSQL's interval '100 years')", ErrInvalidUniqueKey, j.UniquePeriod))
	case j.UniquePeriod > 0 && j.UniqueHold != "":
		return fail("unique_period", fmt.Errorf("%w: a period holds the key for the period: it cannot be combined with hold %q", ErrInvalidUniqueKey, j.UniqueHold))
	case j.UniquePeriod > 0:
		d := j.UniquePeriod
		p.uniquePeriod = &d
	}
	switch j.UniqueHold {
	case "", UniqueHoldActive:
	case UniqueHoldPending, UniqueHoldSucceeded:
		h := string(j.UniqueHold)
		p.uniqueHold = &h
	default:
		return fail("unique_hold", fmt.Errorf("%w: hold %q: use %q, %q or %q", ErrInvalidUniqueKey, j.UniqueHold, UniqueHoldActive, UniqueHoldPending, UniqueHoldSucceeded))
	}
	return p, nil
}

// decodeMetadata is a job's stored metadata as handlers and the read API
// get it. The Go client writes an object of strings; the SQL API takes any
// jsonb, so a value that is not a string is handed over as its JSON text
// ({"retries":3} gives "3"; null gives "") and metadata that is not an
// object as nil
// (TestMetadataWrittenThroughSQL).
func decodeMetadata(raw string) map[string]string {
	var strs map[string]string
	if json.Unmarshal([]byte(raw), &strs) == nil {
		return strs // the usual case: an object of strings
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(raw), &obj) != nil || len(obj) == 0 {
		return nil
	}
	m := make(map[string]string, len(obj))
	for k, v := range obj {
		s := string(v)
		switch {
		case s == "null":
			s = "" // as in the usual case's decoding
		case len(v) > 0 && v[0] == '"':
			_ = json.Unmarshal(v, &s) // valid: jsonb printed it
		}
		m[k] = s
	}
	return m
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// encodePayload turns a NewJob payload into JSON text that PostgreSQL's jsonb
// accepts.
// Payloads over limit bytes are refused before they are parsed.
func encodePayload(v any, limit int) ([]byte, error) {
	var b []byte
	switch p := v.(type) {
	case nil:
		return []byte("{}"), nil
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	case string:
		return nil, fmt.Errorf("%w: got a Go string; pass json.RawMessage for JSON text or a value to encode", ErrInvalidPayload)
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidPayload, err)
		}
	}
	if len(b) == 0 {
		return []byte("{}"), nil
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d (Config.MaxPayloadBytes)", ErrPayloadTooLarge, len(b), limit)
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%w: %d bytes that do not parse", ErrInvalidPayload, len(b))
	}
	// json.Valid accepts invalid UTF-8 inside strings; PostgreSQL does not.
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("%w: not valid UTF-8", ErrInvalidPayload)
	}
	// jsonb also rejects what json.Valid lets through: \u0000, a lone
	// UTF-16 surrogate and numbers beyond numeric's range.
	if err := jsonbSafe(b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPayload, err)
	}
	return b, nil
}

// PostgreSQL numeric's limits, which a jsonb number must fit: 131072
// digits before the decimal point and 16383 after it.
const (
	numericMaxIntDigits  = 131072
	numericMaxFracDigits = 16383
	numericMaxExponent   = 1<<30 - 1 // numeric_in refuses |exponent| >= INT_MAX/2 even for zero
)

// jsonbSafe reports what in b, valid JSON text, PostgreSQL's jsonb input
// refuses although encoding/json accepts it: the escape \u0000, a \u escape
// of a UTF-16 surrogate that is not part of a pair, and a number with more
// digits before or after the decimal point than numeric holds (1e1000000,
// 1e-20000). One pass, no allocation.
func jsonbSafe(b []byte) error {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			end, err := jsonbSafeString(b, i+1)
			if err != nil {
				return err
			}
			i = end
		case c == '-' || (c >= '0' && c <= '9'):
			end, err := jsonbSafeNumber(b, i)
			if err != nil {
				return err
			}
			i = end - 1
		}
	}
	return nil
}

// jsonbSafeString checks the string starting at b[i] (after its opening
// quote) and returns the index of its closing quote.
func jsonbSafeString(b []byte, i int) (int, error) {
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			return i, nil
		case '\\':
			if i+1 < len(b) && b[i+1] != 'u' {
				i++ // a one-character escape
				continue
			}
			r, ok := hex4(b, i+2)
			if !ok {
				return 0, errors.New("a \\u escape without four hex digits")
			}
			switch {
			case r == 0:
				return 0, errors.New("contains \\u0000, which PostgreSQL jsonb cannot store")
			case r >= 0xDC00 && r <= 0xDFFF:
				return 0, fmt.Errorf("\\u%04x is half of a UTF-16 surrogate pair without its first half", r)
			case r >= 0xD800 && r <= 0xDBFF:
				if lo, ok := hex4(b, i+8); !ok || b[i+6] != '\\' || b[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
					return 0, fmt.Errorf("\\u%04x is half of a UTF-16 surrogate pair without its second half", r)
				}
				i += 6 // the pair's second escape
			}
			i += 5
		}
	}
	return i, nil
}

// hex4 decodes the four hex digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// jsonbSafeNumber checks the number starting at b[i] against numeric's
// limits and returns the index just past it.
func jsonbSafeNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	// intDigits: digits before the point from the first that is not zero;
	// fracDigits: all digits after it; firstFrac: the place after the point
	// of its first digit that is not zero (0: none).
	intDigits, fracDigits, firstFrac := int64(0), int64(0), int64(0)
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if intDigits > 0 || b[i] != '0' {
			intDigits++
		}
	}
	if i < len(b) && b[i] == '.' {
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			fracDigits++
			if firstFrac == 0 && b[i] != '0' {
				firstFrac = fracDigits
			}
		}
	}
	var exp int64
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		neg := false
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			neg = b[i] == '-'
			i++
		}
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			if exp < 1<<40 {
				exp = exp*10 + int64(b[i]-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	if exp >= numericMaxExponent || exp <= -numericMaxExponent {
		return 0, fmt.Errorf("the number %.40s... has an exponent beyond PostgreSQL numeric", b[start:i])
	}
	var before int64 // digits before the point once the exponent moved it
	switch {
	case intDigits > 0:
		before = intDigits + exp
	case firstFrac > 0:
		before = exp - firstFrac + 1
	}
	if before > numericMaxIntDigits {
		return 0, fmt.Errorf("the number %.40s... has more than %d digits before the decimal point, beyond PostgreSQL numeric", b[start:i], numericMaxIntDigits)
	}
	if after := fracDigits - exp; after > numericMaxFracDigits {
		return 0, fmt.Errorf("the number %.40s... has more than %d digits after the decimal point, beyond PostgreSQL numeric", b[start:i], numericMaxFracDigits)
	}
	return i, nil
}
