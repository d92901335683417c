// Package sqlident validates and quotes the names pgwake puts into SQL text
// (schemas, channels, slots). Values never go through here: they are always
// sent as query parameters.
package sqlident

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// MaxLen is PostgreSQL's identifier limit (NAMEDATALEN-1) in bytes.
const MaxLen = 63

// ErrInvalid is wrapped by every error Validate returns.
var ErrInvalid = errors.New("invalid SQL identifier")

// Validate reports whether name is a plain lowercase identifier:
// 1 to max bytes of [a-z0-9_], not starting with a digit.
// max <= 0 means MaxLen.
func Validate(what, name string, max int) error {
	if max <= 0 || max > MaxLen {
		max = MaxLen
	}
	if name == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalid, what)
	}
	if len(name) > max {
		return fmt.Errorf("%w: %s %.80q is %d bytes, the limit is %d", ErrInvalid, what, name, len(name), max)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case c >= '0' && c <= '9':
			if i == 0 {
				return fmt.Errorf("%w: %s %q starts with a digit", ErrInvalid, what, name)
			}
		default:
			return fmt.Errorf("%w: %s %.80q has %q at byte %d; use lowercase letters, digits and _", ErrInvalid, what, name, c, i)
		}
	}
	return nil
}

// Quote returns name quoted for use as an identifier in SQL text.
func Quote(parts ...string) string {
	return pgx.Identifier(parts).Sanitize()
}

// Literal returns s quoted as a string constant in SQL text, the same
// whatever standard_conforming_strings is: an escape string (E'...') with
// its quotes and backslashes doubled. For names already validated (queue
// names) that a statement must carry in its text rather than as a
// parameter; values go as parameters.
func Literal(s string) string {
	return "E'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}
