package promreg_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/promreg"
)

func TestRegisterReusesTheRegisteredCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "x_total", Help: "x"}
	a, err := promreg.Register(reg, prometheus.NewCounter(opts))
	require.NoError(t, err)
	b, err := promreg.Register(reg, prometheus.NewCounter(opts))
	require.NoError(t, err)
	require.Same(t, a, b, "the second gets the first")
	a.Inc()
	b.Inc()
	require.Equal(t, 2.0, testutil.ToFloat64(a))

	// Same name, other help: a real conflict stays an error.
	_, err = promreg.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "x_total", Help: "other"}))
	require.Error(t, err)
}
