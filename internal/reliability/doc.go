// Package reliability holds pgwake's fault and hostile-input tests; it has
// no code of its own outside its tests.
//
// The fault tests run a workload whose handler writes an effect row in the
// claim transaction while something goes wrong: worker processes killed
// with SIGKILL, pgwake's connections terminated by the server, PostgreSQL
// restarted (fast and immediate), the network stalled by a TCP proxy,
// producers killed before they commit. Afterwards they check, in one
// snapshot, that every job is final, every succeeded job's effect exists
// exactly once, failed attempts left no effect, and the event log rebuilds
// the jobs table. Figures and how to rerun them: docs/reliability.md.
//
// Normal runs (make test) use a reduced size; PGWAKE_RELIABILITY_FULL=1
// (make reliability) runs the sizes of the issue. The soak test is behind
// the soak build tag (make soak).
package reliability
