package pgcluster

import (
	"bytes"
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configures Start.
type Options struct {
	// BinDir holds initdb and pg_ctl; empty means FindBinDir().
	BinDir string
	// Logf, when set, receives progress messages.
	Logf func(format string, args ...any)
	// ExtraConf adds or overrides postgresql.conf settings. Values are
	// written single-quoted (quotes in the value are escaped) unless they
	// already are, which PostgreSQL accepts for every setting type.
	ExtraConf map[string]string
}

// Cluster is a running throwaway PostgreSQL cluster. Stop it when done.
type Cluster struct {
	// URL connects as superuser postgres, with the cluster's random
	// password, to database postgres:
	// postgres://postgres:PASSWORD@127.0.0.1:PORT/postgres?sslmode=disable.
	// TCP connections need a password (scram-sha-256), so other OS users of
	// the machine cannot connect; the Unix socket is in a directory only the
	// server's OS user can enter.
	// Append "&replication=database" for a logical replication connection.
	URL string
	// Port is the TCP port on 127.0.0.1.
	Port int
	// DataDir is the cluster's data directory (PGDATA).
	DataDir string
	// LogFile is the server log.
	LogFile string
	// BinDir holds the server binaries in use.
	BinDir string

	baseDir string // temp dir holding DataDir, LogFile, socket dir; removed by Stop
	runAs   *osUser
	logf    func(format string, args ...any)

	mu      sync.Mutex
	stopped bool
	stopErr error
}

type osUser struct {
	name     string
	uid, gid uint32
	home     string
}

const (
	tempPrefix    = "pgwake-pgcluster-"
	ownerFile     = "owner.pid"
	confFile      = "pgwake.conf"
	startAttempts = 3
	readyTimeout  = 60 * time.Second
	pgCtlTimeout  = "60" // seconds, pg_ctl -t
	stopTimeout   = "30"
)

// Start creates and starts a new cluster in a fresh temporary directory.
// When the process runs as root, initdb and the server run as OS user
// postgres. On failure nothing is left behind and the error includes the
// tail of the server log when there is one.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	extra, err := renderExtraConf(opts.ExtraConf)
	if err != nil {
		return nil, err
	}
	binDir := opts.BinDir
	if binDir == "" {
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if !hasServerBinaries(binDir) {
		return nil, fmt.Errorf("%w: Options.BinDir %q has no initdb and pg_ctl; %s", ErrNoServerBinaries, binDir, installHint)
	}

	var runAs *osUser
	if os.Geteuid() == 0 {
		if runAs, err = lookupOSUser("postgres"); err != nil {
			return nil, fmt.Errorf("pgcluster: running as root, and PostgreSQL refuses to run as root, so the server must run as OS user postgres: %w "+
				"(create it with `useradd --system --home-dir /var/lib/postgresql postgres` or run as a non-root user)", err)
		}
	}

	parent := tempParent(runAs != nil)
	reapStale(parent, logf)

	base, err := os.MkdirTemp(parent, tempPrefix)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{
		DataDir: filepath.Join(base, "data"),
		LogFile: filepath.Join(base, "server.log"),
		BinDir:  binDir,
		baseDir: base,
		runAs:   runAs,
		logf:    logf,
	}
	defer func() {
		if err != nil {
			if stopErr := c.Stop(); stopErr != nil {
				logf("pgcluster: cleanup after failed start: %v", stopErr)
			}
		}
	}()

	if err := os.WriteFile(filepath.Join(base, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	sockDir := filepath.Join(base, "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := os.Chmod(base, 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if runAs != nil {
		for _, p := range []string{base, sockDir} {
			if err := os.Chown(p, int(runAs.uid), int(runAs.gid)); err != nil {
				return nil, fmt.Errorf("pgcluster: %w", err)
			}
		}
	}
	// A Unix socket path is limited to ~107 bytes; do without one if the
	// temp dir is too deep. Clients here use TCP anyway.
	if len(sockDir)+len("/.s.PGSQL.65535.lock") >= 100 {
		sockDir = ""
	}

	password, err := randomPassword()
	if err != nil {
		return nil, err
	}
	pwFile := filepath.Join(base, "pwfile")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := c.chown(pwFile); err != nil {
		return nil, err
	}
	logf("pgcluster: initdb %s (binaries %s)", c.DataDir, binDir)
	// Trust only on the Unix socket (its directory is private); TCP, which
	// every local user can reach, takes the random password.
	out, err := c.run(ctx, "initdb", "-D", c.DataDir, "-U", "postgres", "--auth-local=trust",
		"--auth-host=scram-sha-256", "--pwfile="+pwFile, "-E", "UTF8", "--locale=C", "--no-sync")
	_ = os.Remove(pwFile)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: initdb failed: %w\n%s", err, out)
	}
	if err := c.ensureReplicationHBA(); err != nil {
		return nil, err
	}
	if err := appendFile(filepath.Join(c.DataDir, "postgresql.conf"),
		"\n# Added by pgwake internal/pgcluster; later settings win.\ninclude '"+confFile+"'\n"); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}

	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pgcluster: finding a free port: %w", err)
		}
		if err := c.writeConf(port, sockDir, extra); err != nil {
			return nil, err
		}
		logOffset := fileSize(c.LogFile)
		logf("pgcluster: starting server on 127.0.0.1:%d (attempt %d)", port, attempt)
		out, err := c.run(ctx, "pg_ctl", "-D", c.DataDir, "-l", c.LogFile, "-w", "-t", pgCtlTimeout, "start")
		if err == nil {
			c.Port = port
			c.URL = fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", password, port)
			break
		}
		newLog := readFrom(c.LogFile, logOffset)
		if attempt < startAttempts && ctx.Err() == nil && portInUse(newLog) {
			logf("pgcluster: port %d was taken, retrying with another one", port)
			_ = c.stopServer() // in case a postmaster lingers
			continue
		}
		return nil, fmt.Errorf("pgcluster: pg_ctl start failed: %w\n%s%s", err, out, c.logTail())
	}

	if err := c.waitReady(ctx); err != nil {
		return nil, err
	}
	logf("pgcluster: ready at 127.0.0.1:%d (data %s)", c.Port, c.DataDir)
	return c, nil
}

// Stop shuts the server down (pg_ctl stop -m immediate; SIGKILL if that
// fails) and removes the temporary directory. It is safe to call more than
// once and from several goroutines; later calls return the first result.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return c.stopErr
	}
	c.stopped = true
	stopErr := c.stopServer()
	rmErr := removeAll(c.baseDir)
	if rmErr != nil {
		rmErr = fmt.Errorf("pgcluster: removing %s: %w", c.baseDir, rmErr)
	}
	c.stopErr = errors.Join(stopErr, rmErr)
	c.logf("pgcluster: stopped, removed %s", c.baseDir)
	return c.stopErr
}

// Restart runs pg_ctl restart with mode "fast", "immediate" or "smart",
// keeping the port, and waits until the server accepts connections again.
// A stopped (SIGSTOP) postmaster is continued first; a server that is not
// running is simply started.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	switch mode {
	case "fast", "immediate", "smart":
	default:
		return fmt.Errorf("pgcluster: Restart mode %q: want fast, immediate or smart", mode)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("pgcluster: Restart after Stop")
	}
	if pid, err := c.PostmasterPID(); err == nil {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	c.logf("pgcluster: restarting (-m %s) on port %d", mode, c.Port)
	if out, err := c.run(ctx, "pg_ctl", "-D", c.DataDir, "-l", c.LogFile, "-w", "-t", pgCtlTimeout,
		"-m", mode, "restart"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl restart -m %s failed: %w\n%s%s", mode, err, out, c.logTail())
	}
	return c.waitReady(ctx)
}

// PostmasterPID returns the postmaster's process id from postmaster.pid.
// The error wraps os.ErrNotExist when the server is not running.
func (c *Cluster) PostmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.DataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgcluster: reading postmaster.pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pgcluster: bad postmaster.pid first line %q", line)
	}
	return pid, nil
}

// LogTail returns up to the last 4 KiB of the server log.
func (c *Cluster) LogTail() string {
	return tailOf(c.LogFile, 4096)
}

// stopServer stops the postmaster if postmaster.pid says one runs.
func (c *Cluster) stopServer() error {
	pid, err := c.PostmasterPID()
	if err != nil {
		return nil // not running (or never started)
	}
	_ = syscall.Kill(pid, syscall.SIGCONT) // a SIGSTOPped postmaster cannot act on SIGQUIT
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	out, err := c.run(ctx, "pg_ctl", "-D", c.DataDir, "-m", "immediate", "-w", "-t", stopTimeout, "stop")
	if err == nil || !processAlive(pid) {
		return nil
	}
	c.logf("pgcluster: pg_ctl stop failed (%v: %s); sending SIGKILL to postmaster %d", err, bytes.TrimSpace(out), pid)
	killTree(pid)
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: postmaster %d survived SIGKILL", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var lastErr error
	for {
		attemptCtx, attemptCancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(attemptCtx, c.URL)
		if err == nil {
			err = conn.Ping(attemptCtx)
			_ = conn.Close(attemptCtx)
		}
		attemptCancel()
		if err == nil {
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: server at %s did not accept connections: %w (last error: %v)%s",
				c.URL, ctx.Err(), lastErr, c.logTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// run runs one of the server binaries (as OS user postgres when root) and
// returns its combined output.
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, name), args...)
	cmd.Dir = c.baseDir
	cmd.Env = childEnv(c.runAs)
	// Own process group: a terminal's Ctrl-C must not reach the postmaster
	// (which inherits it) before our cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if c.runAs != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.runAs.uid, Gid: c.runAs.gid}
	}
	// pg_ctl's postmaster does not keep our pipes, but do not hang forever
	// if some wrapper does.
	cmd.WaitDelay = 5 * time.Second
	return cmd.CombinedOutput()
}

func (c *Cluster) logTail() string {
	t := c.LogTail()
	if t == "" {
		return ""
	}
	return "\n--- server log tail (" + c.LogFile + ") ---\n" + t
}

func (c *Cluster) writeConf(port int, sockDir, extra string) error {
	var b strings.Builder
	b.WriteString("# Written by pgwake internal/pgcluster.\n")
	fmt.Fprintf(&b, "listen_addresses = '127.0.0.1'\n")
	fmt.Fprintf(&b, "port = %d\n", port)
	fmt.Fprintf(&b, "unix_socket_directories = %s\n", quoteConf(sockDir))
	b.WriteString("wal_level = logical\n")
	b.WriteString("max_wal_senders = 20\n")
	b.WriteString("max_replication_slots = 20\n")
	b.WriteString("max_connections = 200\n")
	b.WriteString("max_prepared_transactions = 10\n") // the SQL API's two-phase commit test
	b.WriteString("fsync = off\n")
	b.WriteString("full_page_writes = off\n")
	b.WriteString("shared_buffers = 128MB\n")
	b.WriteString(extra)
	path := filepath.Join(c.DataDir, confFile)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return c.chown(path)
}

// ensureReplicationHBA makes sure replication connections over TCP from
// 127.0.0.1 are allowed with a password (initdb normally writes this line).
func (c *Cluster) ensureReplicationHBA() error {
	path := filepath.Join(c.DataDir, "pg_hba.conf")
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[0] == "host" && f[1] == "replication" && f[2] == "all" &&
			f[3] == "127.0.0.1/32" && f[4] == "scram-sha-256" {
			return nil
		}
	}
	if err := appendFile(path, "\n# Added by pgwake internal/pgcluster.\nhost replication all 127.0.0.1/32 scram-sha-256\n"); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

func (c *Cluster) chown(path string) error {
	if c.runAs == nil {
		return nil
	}
	if err := os.Chown(path, int(c.runAs.uid), int(c.runAs.gid)); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

var confKeyRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$`)

func renderExtraConf(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "", nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if !confKeyRE.MatchString(k) {
			return "", fmt.Errorf("pgcluster: ExtraConf: invalid setting name %q", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# Options.ExtraConf\n")
	for _, k := range keys {
		v := m[k]
		if strings.ContainsAny(v, "\n\r") {
			return "", fmt.Errorf("pgcluster: ExtraConf: value of %s contains a newline", k)
		}
		if !(len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'') {
			v = quoteConf(v)
		}
		fmt.Fprintf(&b, "%s = %s\n", k, v)
	}
	return b.String(), nil
}

func quoteConf(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// freePort asks the kernel for a free port on 127.0.0.1. Someone else may
// grab it before the server binds it; Start retries in that case.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func portInUse(log string) bool {
	return strings.Contains(log, "Address already in use") ||
		strings.Contains(log, "could not create any TCP/IP sockets") ||
		strings.Contains(log, "could not bind IPv4 address")
}

func lookupOSUser(name string) (*osUser, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q: %w", name, u.Gid, err)
	}
	return &osUser{name: name, uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}, nil
}

// tempParent returns the directory to create the cluster's temp dir in.
// When the server runs as another user, every ancestor must be searchable
// by others; if os.TempDir() is not (e.g. TMPDIR under /root), use /tmp.
func tempParent(otherUser bool) string {
	dir := os.TempDir()
	if !otherUser {
		return dir
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return "/tmp"
		}
		if d == filepath.Dir(d) {
			return dir
		}
	}
}

// childEnv is our environment without PG* variables (PGDATA, PGPORT,
// PGHOST... would confuse pg_ctl) and with the C locale.
func childEnv(runAs *osUser) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "LC_") || k == "LANG" || k == "LANGUAGE" ||
			(runAs != nil && (k == "HOME" || k == "USER" || k == "LOGNAME")) {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "LC_ALL=C", "LANG=C")
	if runAs != nil {
		home := runAs.home
		if home == "" {
			home = "/"
		}
		env = append(env, "HOME="+home, "USER="+runAs.name, "LOGNAME="+runAs.name)
	}
	return env
}

// reapStale stops and removes clusters left behind in parent by processes
// that died without calling Stop (e.g. a test binary killed by -timeout).
// Best effort.
func reapStale(parent string, logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(parent, tempPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours to judge (or still being created)
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || owner <= 0 || owner == os.Getpid() || processAlive(owner) {
			continue
		}
		data := filepath.Join(dir, "data")
		if pb, err := os.ReadFile(filepath.Join(data, "postmaster.pid")); err == nil {
			line, _, _ := strings.Cut(string(pb), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && pid > 0 &&
				processAlive(pid) && cmdlineMentions(pid, data) {
				logf("pgcluster: stopping stale postmaster %d of dead owner %d in %s", pid, owner, dir)
				_ = syscall.Kill(pid, syscall.SIGCONT)
				_ = syscall.Kill(pid, syscall.SIGQUIT) // immediate shutdown
				deadline := time.Now().Add(5 * time.Second)
				for processAlive(pid) && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
				}
				if processAlive(pid) {
					killTree(pid)
				}
			}
		}
		logf("pgcluster: removing stale %s (owner %d is gone)", dir, owner)
		_ = removeAll(dir)
	}
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) || !procMounted()
	}
	// Format: pid (comm) state ...; comm may contain spaces and parens.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

func cmdlineMentions(pid int, s string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return !procMounted() // cannot check; trust postmaster.pid
	}
	return bytes.Contains(b, []byte(s))
}

// killTree sends SIGKILL to pid and its direct children (PostgreSQL
// backends put themselves in their own sessions, so a process group kill
// would miss them; they also exit on their own once the postmaster dies).
func killTree(pid int) {
	for _, child := range childrenOf(pid) {
		_ = syscall.Kill(child, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

func childrenOf(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var kids []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state ppid ...
		if len(f) >= 2 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, n)
		}
	}
	return kids
}

// removeAll retries a little: just-killed backends may still be writing.
func removeAll(dir string) error {
	var err error
	for i := 0; i < 20; i++ {
		if err = os.RemoveAll(dir); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func readFrom(path string, off int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(off, 0); err != nil {
		return ""
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(f)
	return buf.String()
}

// tailOf returns up to the last n bytes of path, starting at a line.
func tailOf(path string, n int64) string {
	size := fileSize(path)
	off := size - n
	if off < 0 {
		off = 0
	}
	s := readFrom(path, off)
	if off > 0 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return s
}

// randomPassword is the superuser's password: 128 random bits, hex.
func randomPassword() (string, error) {
	b := make([]byte, 16)
	if _, err := cryptorand.Read(b); err != nil {
		return "", fmt.Errorf("pgcluster: random password: %w", err)
	}
	return hex.EncodeToString(b), nil
}
