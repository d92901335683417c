// Package termsafe makes text from the database or from a handler command
// safe to print on a terminal (pgwake's CLI, its worker's output).
package termsafe

import (
	"fmt"
	"io"
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

// JSON wraps w, which receives the output of a json.Encoder, so that no
// terminal control character reaches it: the encoder escapes C0 but writes
// DEL (0x7f) and C1 (U+0080-U+009F, where CSI, U+009B, starts escape
// sequences) as they are. They can only be inside JSON strings there, so
// each is written as a \u00XX escape: the same JSON, safe on a terminal.
// One Write must hold whole UTF-8 sequences, as an Encode's does.
func JSON(w io.Writer) io.Writer { return jsonWriter{w} }

type jsonWriter struct{ w io.Writer }

func (j jsonWriter) Write(p []byte) (int, error) {
	clean := true
	for i := 0; i < len(p); i++ {
		if p[i] == 0x7f || (p[i] == 0xc2 && i+1 < len(p) && p[i+1] >= 0x80 && p[i+1] <= 0x9f) {
			clean = false
			break
		}
	}
	if clean {
		return j.w.Write(p)
	}
	out := make([]byte, 0, len(p)+32)
	for i := 0; i < len(p); i++ {
		switch {
		case p[i] == 0x7f:
			out = append(out, `\u007f`...)
		case p[i] == 0xc2 && i+1 < len(p) && p[i+1] >= 0x80 && p[i+1] <= 0x9f:
			out = fmt.Appendf(out, `\u%04x`, p[i+1])
			i++
		default:
			out = append(out, p[i])
		}
	}
	if _, err := j.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
