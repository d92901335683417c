package sqlapi_test

import (
	"bufio"
	"bytes"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Each client test enqueues clientJobs jobs, clientGapMS apart, so that the
// idle worker is asleep again before the next commit.
const (
	clientJobs  = 8
	clientGapMS = 30
)

// client is one real PostgreSQL client: how to run its script, and the
// SQLSTATE its bad input must get (docs/sql.md).
type client struct {
	name string
	// missing says why the client cannot run ("" when it can).
	missing func() string
	// commands are run one after another (psql runs once per job).
	commands func(dir, schema, queue string) []*exec.Cmd
	// state and column are the SQLSTATE and COLUMN its bad input must
	// get; column "-" for psql, which keeps no COLUMN.
	state, column string
}

const installHint = "run scripts/install-test-clients.sh as root (apt-get, npm ci)"

func lookPath(name, what string) string {
	if _, err := exec.LookPath(name); err != nil {
		return what + ": " + name + " not found; " + installHint
	}
	return ""
}

// debianPython is the Python that Debian's python3-psycopg installs into
// (a python3 earlier on PATH, pyenv's say, does not see it).
func debianPython() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

const jdbcJar = "/usr/share/java/postgresql.jar"

var clients = []client{
	{
		name:    "psql",
		missing: func() string { return lookPath("psql", "psql (Debian postgresql-client)") },
		commands: func(dir, schema, queue string) []*exec.Cmd {
			var cmds []*exec.Cmd
			for n := range clientJobs {
				cmds = append(cmds, exec.Command("psql", "-X", "-q", "-v", "n="+strconv.Itoa(n), "-v", "schema="+schema,
					"-v", "queue="+queue, "-f", filepath.Join(dir, "psql", "enqueue.sql")))
			}
			return cmds
		},
		state:  "PW001",
		column: "-",
	},
	{
		name: "python",
		missing: func() string {
			if err := exec.Command(debianPython(), "-c", "import psycopg").Run(); err != nil {
				return "python: " + debianPython() + " cannot import psycopg (Debian python3-psycopg); " + installHint
			}
			return ""
		},
		commands: func(dir, schema, queue string) []*exec.Cmd {
			return []*exec.Cmd{exec.Command(debianPython(), filepath.Join(dir, "python", "enqueue.py"))}
		},
		state:  "PW002",
		column: "queue",
	},
	{
		name: "node",
		missing: func() string {
			if m := lookPath("node", "node"); m != "" {
				return m
			}
			if _, err := os.Stat(filepath.Join("clients", "node", "node_modules", "pg")); err != nil {
				return "node: clients/node/node_modules/pg missing (npm ci); " + installHint
			}
			return ""
		},
		commands: func(dir, schema, queue string) []*exec.Cmd {
			return []*exec.Cmd{exec.Command("node", filepath.Join(dir, "node", "enqueue.js"))}
		},
		state:  "PW005",
		column: "delay",
	},
	{
		name: "ruby",
		missing: func() string {
			if err := exec.Command("ruby", "-e", "require 'pg'").Run(); err != nil {
				return "ruby: ruby with the pg gem (Debian ruby-pg) not found; " + installHint
			}
			return ""
		},
		commands: func(dir, schema, queue string) []*exec.Cmd {
			return []*exec.Cmd{exec.Command("ruby", filepath.Join(dir, "ruby", "enqueue.rb"))}
		},
		state:  "PW006",
		column: "max_attempts",
	},
	{
		name: "java",
		missing: func() string {
			// Source-file mode compiles in memory: it needs a JDK, not
			// just a runtime.
			for _, bin := range []string{"java", "javac"} {
				if m := lookPath(bin, "java (a JDK, Debian default-jdk-headless)"); m != "" {
					return m
				}
			}
			if _, err := os.Stat(jdbcJar); err != nil {
				return "java: " + jdbcJar + " missing (Debian libpostgresql-jdbc-java); " + installHint
			}
			return ""
		},
		commands: func(dir, schema, queue string) []*exec.Cmd {
			// Source-file mode: compiled in memory, no build step.
			return []*exec.Cmd{exec.Command("java", "-cp", jdbcJar, filepath.Join(dir, "java", "Enqueue.java"))}
		},
		state:  "PW004",
		column: "priority",
	},
}

// TestClients runs each real client against a producer role that has only
// EXECUTE on the SQL API and INSERT on the business table: an enqueue rolled
// back with its business write leaves nothing; clientJobs commits each get a
// job that an idle worker (one-hour poll) runs soon after the commit; a bad
// input gets its documented SQLSTATE. Not parallel: the latencies are
// measured.
func TestClients(t *testing.T) {
	dir, err := filepath.Abs("clients")
	require.NoError(t, err)
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			if why := c.missing(); why != "" {
				t.Skip(why)
			}
			w := newWorld(t)
			q := "sqlapi-" + c.name
			wk := w.startWorker(q)
			env := w.clientEnv(q)

			var out bytes.Buffer
			start := time.Now()
			for _, cmd := range c.commands(dir, w.schema, q) {
				cmd.Env = env
				cmd.Stdout = &out
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				require.NoError(t, cmd.Run(), "%s: %s\nstdout:\n%s\nstderr:\n%s", c.name, cmd.String(), out.String(), stderr.String())
			}
			t.Logf("%s ran in %s", c.name, time.Since(start).Round(time.Millisecond))

			var rolledBack, committed []int64
			commitAt := map[int64]time.Time{}
			states := map[string]int{}
			sc := bufio.NewScanner(&out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				switch {
				case len(f) == 2 && f[0] == "rolledback":
					id, err := strconv.ParseInt(f[1], 10, 64)
					require.NoError(t, err)
					rolledBack = append(rolledBack, id)
				case len(f) == 3 && f[0] == "committed":
					id, err := strconv.ParseInt(f[1], 10, 64)
					require.NoError(t, err)
					us, err := strconv.ParseInt(f[2], 10, 64)
					require.NoError(t, err)
					committed = append(committed, id)
					commitAt[id] = time.UnixMicro(us)
				case len(f) == 3 && f[0] == "sqlstate":
					states[f[1]+" "+f[2]]++
				case len(f) == 0:
				default:
					t.Fatalf("%s printed %q", c.name, sc.Text())
				}
			}
			require.NotEmpty(t, rolledBack)
			require.Len(t, committed, clientJobs)
			require.Equal(t, map[string]int{c.state + " " + c.column: len(c.commands(dir, w.schema, q))}, states, "the bad input's SQLSTATE and COLUMN")

			// Rolled back: no job, no event, no order.
			require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE id = ANY($1)`, rolledBack))
			require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("events")+` WHERE job_id = ANY($1)`, rolledBack))
			require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("orders")+` WHERE note LIKE '% rollback%'`))
			// Committed: each job with its enqueued event and its order;
			// the bad inputs wrote nothing.
			require.Equal(t, clientJobs, w.count(`SELECT count(*) FROM `+w.table("orders")))
			require.Equal(t, clientJobs, w.count(`SELECT count(*) FROM `+w.table("jobs")))
			require.Equal(t, clientJobs, w.count(`SELECT count(*) FROM `+w.table("events")+` WHERE type = 'enqueued' AND job_id = ANY($1)`, committed))

			wk.wait(t, committed, 30*time.Second)
			var lat []time.Duration
			for _, id := range committed {
				lat = append(lat, wk.startedAt(id).Sub(commitAt[id]))
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			p50, p99 := lat[len(lat)/2], lat[(len(lat)*99+99)/100-1]
			t.Logf("%s: commit to handler start over %d jobs: p50 %s, p99 %s, max %s", c.name, len(lat),
				p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
			// The wake-up path, not the poll (an hour), ran every job: a
			// missed wake-up would wait for the poll. The timings are
			// logged, not asserted (a busy machine stretches them);
			// docs/sql.md has figures from a quiet one.
			require.Less(t, lat[len(lat)-1], 20*time.Second, "slowest commit-to-start: the poll, not a wake-up, ran it")
		})
	}
}

// clientEnv is the environment of a client script: libpq's variables for
// the producer role, the schema and queue, the job count and gap.
func (w *world) clientEnv(q string) []string {
	u, err := url.Parse(w.prodURL)
	require.NoError(w.t, err)
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	pass, _ := u.User.Password()
	env := append(os.Environ(),
		"PGHOST="+host, "PGPORT="+port, "PGDATABASE="+strings.TrimPrefix(u.Path, "/"),
		"PGUSER="+u.User.Username(), "PGPASSWORD="+pass, "PGSSLMODE=disable", "PGAPPNAME=pgwake-sqlapi-test",
		"PGWAKE_SCHEMA="+w.schema, "PGWAKE_QUEUE="+q,
		"PGWAKE_JOBS="+strconv.Itoa(clientJobs), "PGWAKE_GAP_MS="+strconv.Itoa(clientGapMS))
	return env
}
