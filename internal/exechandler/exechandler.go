// Package exechandler is the queue.Handler behind `pgwake worker --handler
// KIND=exec:COMMAND`: it runs the job as a shell command, the payload on
// stdin and the job in the environment, and turns its exit status and
// control lines into the attempt's outcome. cmd/pgwake wires it.
package exechandler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/termsafe"
	"github.com/pgwake/pgwake/queue"
)

// stderrTailBytes is how much of a failed command's stderr becomes the
// job's error.
const stderrTailBytes = 2048

// Handler runs a job as `sh -c Command`: payload on stdin, job details in
// the environment (PGWAKE_JOB_ID, _KIND, _QUEUE, _ATTEMPT, _MAX_ATTEMPTS,
// _PRIORITY), exit 0 for success, otherwise the tail of stderr is the
// error. A control line on stdout ("::pgwake snooze D", "::pgwake cancel
// [REASON]", "::pgwake retry-after D [REASON]") asks for another outcome.
// When the attempt's context ends (Cancel of the running job, timeout,
// shutdown deadline) its process group gets SIGTERM, then SIGKILL after
// Grace. The command's output is copied line by line to Stdout and Stderr,
// each line prefixed with the job and escaped (termsafe).
type Handler struct {
	Command string
	Env     []string  // the command's environment, before the job's variables (see Environ)
	Stdout  io.Writer // the command's stdout is copied here
	Stderr  io.Writer // and its stderr here (besides the tail kept)
	Procs   *ProcGroups
	Grace   time.Duration // SIGTERM to SIGKILL; 0 sends SIGKILL at once
}

// connectionEnv are the variables that hold pgwake's connection settings:
// its own URLs (DATABASE_URL, the CLI's fallback) and the libpq variables
// pgx reads. Every PGWAKE_ variable is pgwake's too.
var connectionEnv = map[string]bool{
	"DATABASE_URL": true, "PGHOST": true, "PGPORT": true, "PGDATABASE": true, "PGUSER": true,
	"PGPASSWORD": true, "PGPASSFILE": true, "PGSERVICE": true, "PGSERVICEFILE": true, "PGAPPNAME": true,
	"PGCONNECT_TIMEOUT": true, "PGSSLMODE": true, "PGSSLKEY": true, "PGSSLCERT": true, "PGSSLROOTCERT": true,
	"PGSSLPASSWORD": true, "PGSSLSNI": true, "PGSSLNEGOTIATION": true, "PGTARGETSESSIONATTRS": true,
	"PGOPTIONS": true, "PGREQUIRESSL": true, "PGSSLCERTMODE": true, "PGCHANNELBINDING": true,
	"PGREQUIREAUTH": true, "PGMINPROTOCOLVERSION": true, "PGMAXPROTOCOLVERSION": true, "PGTZ": true,
}

// Environ is environ (os.Environ()) for handler commands: without
// pgwake's connection settings (database and broker URLs, passwords),
// unless passConnection.
func Environ(environ []string, passConnection bool) []string {
	if passConnection {
		return environ
	}
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if connectionEnv[k] || strings.HasPrefix(k, "PGWAKE_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// ProcGroups tracks running commands so a hard stop can kill them all.
type ProcGroups struct {
	mu   sync.Mutex
	pids map[int]struct{}
}

// NewProcGroups returns an empty ProcGroups.
func NewProcGroups() *ProcGroups { return &ProcGroups{pids: map[int]struct{}{}} }

func (p *ProcGroups) add(pid int) {
	p.mu.Lock()
	p.pids[pid] = struct{}{}
	p.mu.Unlock()
}

func (p *ProcGroups) remove(pid int) {
	p.mu.Lock()
	delete(p.pids, pid)
	p.mu.Unlock()
}

// KillAll sends SIGKILL to every running command's process group.
func (p *ProcGroups) KillAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pid := range p.pids {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// Handle implements queue.Handler.
func (h *Handler) Handle(ctx context.Context, _ pgx.Tx, job *queue.Job) error {
	cmd := exec.Command("sh", "-c", h.Command)
	cmd.SysProcAttr = handlerSysProcAttr()
	cmd.Stdin = bytes.NewReader(job.Payload)
	cmd.Env = append(slices.Clip(h.Env),
		"PGWAKE_JOB_ID="+strconv.FormatInt(job.ID, 10),
		"PGWAKE_JOB_KIND="+job.Kind,
		"PGWAKE_JOB_QUEUE="+job.Queue,
		"PGWAKE_JOB_ATTEMPT="+strconv.Itoa(job.Attempt),
		"PGWAKE_JOB_MAX_ATTEMPTS="+strconv.Itoa(job.MaxAttempts),
		"PGWAKE_JOB_PRIORITY="+strconv.Itoa(job.Priority),
	)
	tail := &tailBuffer{max: stderrTailBytes}
	// The command's output is copied line by line, each line prefixed with
	// the job and escaped: a command cannot forge pgwake's log lines or
	// send escape sequences to the terminal reading them.
	out := newLineWriter(h.Stdout, fmt.Sprintf("job %d %s stdout: ", job.ID, termsafe.Text(job.Kind, false)))
	ctl := &controlWatcher{}
	out.onLine = ctl.line
	errOut := newLineWriter(h.Stderr, fmt.Sprintf("job %d %s stderr: ", job.ID, termsafe.Text(job.Kind, false)))
	defer out.flush()
	defer errOut.flush()
	cmd.Stdout = out
	cmd.Stderr = io.MultiWriter(tail, errOut)
	// A background process the command left behind may hold its output
	// open; stop reading shortly after the command itself has exited.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start sh -c: %w", err)
	}
	pid := cmd.Process.Pid
	h.Procs.add(pid)
	defer h.Procs.remove(pid)

	waitDone := make(chan error, 1)
	go func() { waitDone <- cmd.Wait() }()
	var err error
	select {
	case err = <-waitDone:
	case <-ctx.Done():
		select {
		case err = <-waitDone:
			// It finished just as time ran out: its exit status stands.
			return h.result(err, tail)
		default:
		}
		// Stop the whole group, sh and whatever it started: SIGTERM, and
		// SIGKILL for what is still running after the grace period. The
		// group is watched, not sh: a child that ignores SIGTERM outlives
		// sh's exit and is killed too (TestExecKillsTheGroupNotJustTheShell).
		how := "killed"
		if h.Grace > 0 {
			_ = syscall.Kill(-pid, syscall.SIGTERM)
			if groupExits(pid, h.Grace) {
				how = "terminated"
			}
		}
		if how == "killed" {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		select {
		case <-waitDone:
		case <-time.After(5 * time.Second):
			// Something outside the group holds the pipes; give up on it.
		}
		cause := context.Cause(ctx)
		if cause == nil {
			cause = ctx.Err()
		}
		return fmt.Errorf("command %s (process group %d): %w%s", how, pid, cause, tail.suffix())
	}
	out.flush()
	return h.outcome(h.result(err, tail), ctl)
}

// groupExits reports whether every process of process group pgid is gone
// within d (sh is reaped by its Wait as it exits).
func groupExits(pgid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// controlPrefix starts a control line: a line of the command's stdout that
// asks for an outcome other than its exit status gives.
const controlPrefix = "::pgwake "

// control is an outcome a command asked for on stdout.
type control struct {
	verb   string // "snooze", "cancel" or "retry-after"
	delay  time.Duration
	reason string
	bad    string // a malformed control line, quoted in the attempt's error
}

// parseControl reads one control line (without controlPrefix):
//
//	snooze DURATION             pending again after DURATION, attempt not counted
//	cancel [REASON]             cancelled, not retried
//	retry-after DURATION [REASON]  failed attempt, retried after DURATION
func parseControl(line string) control {
	verb, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	rest = strings.TrimSpace(rest)
	switch verb {
	case "cancel":
		return control{verb: verb, reason: rest}
	case "snooze", "retry-after":
		ds, reason, _ := strings.Cut(rest, " ")
		d, err := time.ParseDuration(ds)
		if err != nil || d < 0 {
			return control{bad: line}
		}
		if verb == "snooze" && reason != "" {
			return control{bad: line}
		}
		return control{verb: verb, delay: d, reason: strings.TrimSpace(reason)}
	}
	return control{bad: line}
}

// controlWatcher keeps the last control line of a command's stdout.
type controlWatcher struct {
	mu   sync.Mutex
	last *control
}

func (c *controlWatcher) line(l string) {
	rest, ok := strings.CutPrefix(l, controlPrefix)
	if !ok {
		return
	}
	ctl := parseControl(rest)
	c.mu.Lock()
	c.last = &ctl
	c.mu.Unlock()
}

// outcome applies the command's last control line, if any, to the result
// of its exit status (err: nil for exit 0).
func (h *Handler) outcome(err error, ctl *controlWatcher) error {
	ctl.mu.Lock()
	c := ctl.last
	ctl.mu.Unlock()
	if c == nil {
		return err
	}
	if c.bad != "" {
		return fmt.Errorf("malformed control line %q (want %ssnooze D, %scancel [REASON] or %sretry-after D [REASON])",
			termsafe.Text(c.bad, false), controlPrefix, controlPrefix, controlPrefix)
	}
	reason := err
	if c.reason != "" {
		reason = errors.New(c.reason)
	}
	switch c.verb {
	case "snooze":
		return queue.Snooze(c.delay)
	case "cancel":
		return queue.Cancel(reason)
	default:
		if reason == nil {
			reason = errors.New("retry requested by the command")
		}
		return queue.RetryAfter(c.delay, reason)
	}
}

// result turns the command's exit into the attempt's outcome.
func (h *Handler) result(err error, tail *tailBuffer) error {
	if err == nil || errors.Is(err, exec.ErrWaitDelay) {
		// ErrWaitDelay: exit status 0, but something it started kept its
		// output open; the command succeeded.
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Errorf("command killed by signal %s%s", ws.Signal(), tail.suffix())
		}
		return fmt.Errorf("exit status %d%s", ee.ExitCode(), tail.suffix())
	}
	return fmt.Errorf("command: %w%s", err, tail.suffix())
}

// lineWriterMax is the longest line a lineWriter holds back; a longer one is
// written in pieces of this size.
const lineWriterMax = 16 << 10

// lineWriter writes each line written to it as prefix + the line with
// control characters escaped (printable), in one Write of w per line.
type lineWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
	onLine func(string) // when set, sees each line (unescaped)
}

func newLineWriter(w io.Writer, prefix string) *lineWriter {
	return &lineWriter{w: w, prefix: prefix}
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 && len(l.buf) < lineWriterMax {
			return len(p), nil
		}
		if i < 0 {
			i = lineWriterMax
		}
		line := l.buf[:i]
		rest := l.buf[min(i+1, len(l.buf)):]
		if i == lineWriterMax {
			rest = l.buf[i:]
		}
		l.emit(line)
		l.buf = append(l.buf[:0], rest...)
	}
}

// emit writes one line; errors of w are ignored, as a full log must not
// fail the job.
func (l *lineWriter) emit(line []byte) {
	s := strings.TrimSuffix(string(line), "\r")
	if l.onLine != nil {
		l.onLine(s)
	}
	_, _ = io.WriteString(l.w, l.prefix+termsafe.Text(s, false)+"\n")
}

// flush writes what is left of an unfinished last line.
func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emit(l.buf)
		l.buf = l.buf[:0]
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
	cut bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	return len(p), nil
}

// suffix is ": <last stderr>" or "" when stderr was empty.
func (t *tailBuffer) suffix() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(strings.ToValidUTF8(string(t.buf), "\uFFFD"))
	if s == "" {
		return ""
	}
	if t.cut {
		s = "..." + s
	}
	return ": " + s
}
