// Package harness is the public door to pgwake's benchmark harness
// (internal/bench) for the separate module in bench/peers, which runs the
// same modes against River and watermill-sql. It only re-exports; see
// internal/bench for the modes and their method. It carries no
// compatibility promise: it changes with the benchmarks.
package harness
