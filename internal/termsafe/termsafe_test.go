package termsafe_test

import (
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
