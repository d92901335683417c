package ui

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// Text the pages cut (a job's error in the jobs list, an error or a
// payload on a job page) is cut at a character boundary: a page served as
// UTF-8 never holds half a character. Before, 119 bytes of "a" and an "é"
// cut at 120 left its first byte alone.
func TestCutTextKeepsCharacters(t *testing.T) {
	s := strings.Repeat("a", 119) + "é and more"
	got := cutText(s, 120)
	require.True(t, utf8.ValidString(got), "%q", got)
	require.Equal(t, strings.Repeat("a", 119)+"…", got)
	require.Equal(t, "short", cutText("short", 120))
	p, cut := pretty([]byte(`"`+strings.Repeat("a", 18)+`é"`), 20)
	require.True(t, cut)
	require.True(t, utf8.ValidString(p), "%q", p)
}
