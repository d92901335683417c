// Package termsafe makes text from the database or from a handler command
// safe to print on a terminal (pgwake's CLI, its worker's output).
package termsafe

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text makes text from the database safe to print on a terminal:
// control characters (C0, DEL, C1: escape sequences start with them) are
// written as Go escapes (\x1b, \u009b), bytes that are not UTF-8 as \xff.
// With keepNewlines, '\n' stays (multi-line errors); tabs are always
// escaped, since they would shift tabwriter's columns.
func Text(s string, keepNewlines bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || (unicode.IsControl(r) && !(keepNewlines && r == '\n')) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case keepNewlines && r == '\n':
			b.WriteByte('\n')
		case r < 0x80 && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
