package termsafe_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/termsafe"
)

func TestText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in    string
		lines bool
		want  string
	}{
		{"plain text, ünïcode", false, "plain text, ünïcode"},
		{"\x1b]0;pwned\x07title", false, `\x1b]0;pwned\x07title`},
		{"red\x1b[31m\nnext\tcol", true, "red\\x1b[31m\nnext\\x09col"},
		{"a\nb", false, `a\x0ab`},
		{"c1 \u009b2J del \x7f bad \xff", false, `c1 \u009b2J del \x7f bad \xff`},
	} {
		require.Equal(t, c.want, termsafe.Text(c.in, c.lines), "%q", c.in)
	}
}

// JSON output keeps its meaning and loses its terminal controls: DEL and
// C1 (CSI, U+009B) become \u escapes, which json.Encoder leaves raw.
func TestJSONEscapesWhatTheEncoderLeaves(t *testing.T) {
	var b strings.Builder
	in := map[string]string{"a": "x\u009b2J\x7fé\u00a0z", "\u0085k": "\x1b["}
	require.NoError(t, json.NewEncoder(termsafe.JSON(&b)).Encode(in))
	out := b.String()
	require.False(t, strings.ContainsAny(out, "\x1b\x7f\u0085\u009b"), "%q", out)
	var back map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &back))
	require.Equal(t, in, back, "the same JSON")
	require.Contains(t, out, "é\u00a0z", "other characters stay as they are")
}
