package reliability

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// helperEnv, when set, makes the test binary a helper process instead of
// running tests: "worker" runs a workload worker until killed, "producer"
// begins a transaction, enqueues and waits to be killed before committing.
const helperEnv = "PGWAKE_RELIABILITY_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		pgtest.Main(m)
	case "worker":
		os.Exit(workerMain())
	case "producer":
		os.Exit(producerMain())
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", helperEnv, os.Getenv(helperEnv))
		os.Exit(2)
	}
}

// helperPool opens the helper's pool from its environment.
func helperPool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv("PGWAKE_RELIABILITY_URL"))
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv("PGWAKE_RELIABILITY_APP")
	cfg.MaxConns = 8
	return pgxpool.NewWithConfig(ctx, cfg)
}

func workerMain() int {
	ctx := context.Background()
	hold, _ := time.ParseDuration(os.Getenv("PGWAKE_RELIABILITY_HOLD"))
	pool, err := helperPool(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	c, err := queue.New(pool, workerConfig(os.Getenv("PGWAKE_RELIABILITY_SCHEMA"), 250*time.Millisecond, hold))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	fmt.Println("ready")
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	return 0
}

// helper is a running helper process.
type helper struct {
	cmd *exec.Cmd
	app string
	out *bufio.Reader
}

// startHelper runs the test binary as a helper of the given role and waits
// for its first line of output.
func (w *world) startHelper(role, app string, env ...string) (*helper, string) {
	w.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+role, "PGWAKE_RELIABILITY_URL="+w.url,
		"PGWAKE_RELIABILITY_SCHEMA="+w.schema, "PGWAKE_RELIABILITY_APP="+app)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	require.NoError(w.t, err)
	cmd.Stderr = os.Stderr
	require.NoError(w.t, cmd.Start())
	h := &helper{cmd: cmd, app: app, out: bufio.NewReader(out)}
	w.t.Cleanup(h.kill)
	line, err := h.out.ReadString('\n')
	require.NoError(w.t, err, "helper %s did not start", role)
	return h, strings.TrimSpace(line)
}

// kill sends SIGKILL and reaps the process; safe to call twice.
func (h *helper) kill() {
	if h.cmd.ProcessState != nil {
		return
	}
	_ = h.cmd.Process.Signal(syscall.SIGKILL)
	_ = h.cmd.Wait()
}
