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

func TestSumAndSumBy(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"queue", "source"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h_seconds", Help: "h"}, []string{"queue"})
	reg.MustRegister(c, h)
	c.WithLabelValues("a", "notify").Add(2)
	c.WithLabelValues("a", "poll").Add(1)
	c.WithLabelValues("b", "notify").Add(4)
	h.WithLabelValues("a").Observe(1)
	h.WithLabelValues("a").Observe(2)

	sum := func(name string, labels ...string) float64 {
		v, err := promreg.Sum(reg, name, labels...)
		require.NoError(t, err)
		return v
	}
	require.Equal(t, 7.0, sum("c_total"))
	require.Equal(t, 3.0, sum("c_total", "queue", "a"))
	require.Equal(t, 4.0, sum("c_total", "queue", "b", "source", "notify"))
	require.Equal(t, 2.0, sum("h_seconds", "queue", "a"), "histograms count samples")
	require.Zero(t, sum("absent_total"))
	by, err := promreg.SumBy(reg, "c_total", "source")
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"notify": 6, "poll": 1}, by)
}
