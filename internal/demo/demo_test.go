package demo

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	var v []time.Duration
	for i := 1; i <= 100; i++ {
		v = append(v, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 50*time.Millisecond, percentile(v, 0.5))
	require.Equal(t, 99*time.Millisecond, percentile(v, 0.99))
	require.Equal(t, 100*time.Millisecond, percentile(v, 1))
	require.Equal(t, time.Duration(0), percentile(nil, 0.5))
	var b strings.Builder
	writeHistogram(&b, v)
	require.Contains(t, b.String(), "50ms-100ms")
	require.Contains(t, b.String(), " 50\n")
}
