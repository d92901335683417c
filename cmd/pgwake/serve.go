package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// defaultMetricsAddr is loopback-only: exposing metrics beyond the host is
// an explicit choice (--metrics-addr :9464).
const defaultMetricsAddr = "127.0.0.1:9464"

// newRegistry returns a registry with the Go runtime and process collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// metricsServer serves /metrics and /healthz.
type metricsServer struct {
	srv  *http.Server
	ln   net.Listener
	addr string // the bound address, with the real port
}

// listenMetrics binds addr now (so a busy port is reported before workers
// start); serve starts answering.
func listenMetrics(addr string, reg *prometheus.Registry, pool *pgxpool.Pool, log *zap.Logger) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot serve metrics on %s: %w; pick another --metrics-addr, or --metrics-addr off", addr, errors.Unwrap(err))
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: zap.NewStdLog(log.Named("metrics")), ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := pool.Ping(ctx); err != nil {
			// The cause (which may name the role, host or database) goes
			// to the log, not to whoever can reach the endpoint.
			log.Warn("health check failed: database unreachable", zap.String("cause", connectCause(err)))
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "pgwake: /metrics (Prometheus), /healthz")
	})
	return &metricsServer{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		ln:   ln,
		addr: ln.Addr().String(),
	}, nil
}

func (m *metricsServer) serve(log *zap.Logger) {
	if err := m.srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("metrics server stopped", zap.Error(err))
	}
}

func (m *metricsServer) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = m.srv.Shutdown(ctx)
}

func metricsOff(addr string) bool {
	a := strings.ToLower(strings.TrimSpace(addr))
	return a == "" || a == "off" || a == "none"
}
