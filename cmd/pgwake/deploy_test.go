package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// The docker compose setup cannot run here (no Docker engine); these tests
// keep it, the Grafana dashboard and the metrics reference true to the code.

const repoRoot = "../.."

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string                    `yaml:"image"`
	Build       any                       `yaml:"build"`
	Command     any                       `yaml:"command"`
	Entrypoint  []string                  `yaml:"entrypoint"`
	Environment map[string]string         `yaml:"environment"`
	Ports       []string                  `yaml:"ports"`
	Volumes     []string                  `yaml:"volumes"`
	DependsOn   map[string]map[string]any `yaml:"depends_on"`
	StopGrace   string                    `yaml:"stop_grace_period"`
	Healthcheck map[string]any            `yaml:"healthcheck"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	require.NoError(t, err)
	// depends_on is written as a map for services with conditions and as a
	// list for the others; normalise lists to maps first.
	var raw map[string]any
	require.NoError(t, yaml.Unmarshal(b, &raw))
	for _, s := range raw["services"].(map[string]any) {
		svc := s.(map[string]any)
		if list, ok := svc["depends_on"].([]any); ok {
			m := map[string]any{}
			for _, d := range list {
				m[d.(string)] = map[string]any{"condition": "service_started"}
			}
			svc["depends_on"] = m
		}
	}
	nb, err := yaml.Marshal(raw)
	require.NoError(t, err)
	var c composeFile
	require.NoError(t, yaml.Unmarshal(nb, &c))
	return c
}

func commandList(t *testing.T, v any) []string {
	t.Helper()
	switch c := v.(type) {
	case []any:
		out := make([]string, len(c))
		for i, x := range c {
			out[i] = fmt.Sprint(x)
		}
		return out
	case string:
		return strings.Fields(c)
	}
	t.Fatalf("command %v is neither a list nor a string", v)
	return nil
}

// uncompose undoes compose's $$ escaping; a lone $ would be interpolated by
// compose from the host environment, which is never what we mean.
func uncompose(t *testing.T, s string) string {
	t.Helper()
	require.NotRegexp(t, `(^|[^$])\$([^$]|$)`, strings.ReplaceAll(s, "$$", ""), "unescaped $ in %q: compose would interpolate it", s)
	return strings.ReplaceAll(s, "$$", "$")
}

// TestComposeRoles runs the compose demo's roles script (psql) against a
// real PostgreSQL after the migrations, twice: the roles exist, none is a
// superuser, the stream role has REPLICATION, and a producer and a worker
// connected as the compose services are do their work.
func TestComposeRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Pool(t)
	dbName := fmt.Sprintf("compose_%08x", rand.Uint32())
	_, err := admin.Exec(ctx, `CREATE DATABASE `+dbName)
	require.NoError(t, err)
	roleNames := []string{"pgwake_producer", "pgwake_worker", "pgwake_operator", "pgwake_stream"}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, `DROP DATABASE IF EXISTS `+dbName+` WITH (FORCE)`)
		for _, r := range roleNames {
			_, _ = admin.Exec(ctx, `DROP ROLE IF EXISTS `+r)
		}
	})
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	u.Path = "/" + dbName
	owner := pgtest.PoolOn(t, u.String(), nil)
	_, err = migrations.Up(ctx, owner, migrations.DefaultSchema)
	require.NoError(t, err)
	pass, _ := u.User.Password()
	for range 2 {
		cmd := exec.Command("sh", filepath.Join(repoRoot, "deploy/postgres/roles.sh"))
		cmd.Env = append(cliEnvVars(), "PGHOST="+u.Hostname(), "PGPORT="+u.Port(), "PGUSER="+u.User.Username(),
			"PGPASSWORD="+pass, "PGDATABASE="+dbName, "PGWAKE_GRANTS="+filepath.Join(repoRoot, "docs/grants.sql"))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	for _, r := range roleNames {
		var super, repl bool
		require.NoError(t, owner.QueryRow(ctx, `SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = $1`, r).Scan(&super, &repl))
		require.False(t, super, r)
		require.Equal(t, r == "pgwake_stream", repl, r)
	}
	as := func(role string) *pgxpool.Pool {
		ru := *u
		ru.User = url.UserPassword(role, role)
		return pgtest.PoolOn(t, ru.String(), func(c *pgxpool.Config) { c.MaxConns = 4 })
	}
	prod, err := queue.New(as("pgwake_producer"), queue.Config{})
	require.NoError(t, err)
	r, err := prod.Enqueue(ctx, queue.NewJob{Kind: "hello"})
	require.NoError(t, err)
	done := make(chan int64, 1)
	w, err := queue.New(as("pgwake_worker"), queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
		Handlers: map[string]queue.Handler{"hello": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			done <- j.ID
			return nil
		})},
	})
	require.NoError(t, err)
	stop := pgtest.RunInBackground(t, "compose worker", w.Run)
	defer stop()
	select {
	case id := <-done:
		require.Equal(t, r.ID, id)
	case <-time.After(30 * time.Second):
		t.Fatal("the worker role did not run the producer role's job")
	}
}

func TestComposeServices(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	for _, name := range []string{"postgres", "migrate", "worker", "producer", "prometheus", "grafana"} {
		require.Contains(t, c.Services, name)
	}

	pg := c.Services["postgres"]
	pgCmd := strings.Join(commandList(t, pg.Command), " ")
	require.Contains(t, pgCmd, "-c wal_level=logical")
	require.Equal(t, []string{"127.0.0.1:5432:5432"}, pg.Ports)
	require.NotEmpty(t, pg.Healthcheck)
	user, pass, db := pg.Environment["POSTGRES_USER"], pg.Environment["POSTGRES_PASSWORD"], pg.Environment["POSTGRES_DB"]
	wantURL := fmt.Sprintf("postgres://%s:%s@postgres:5432/%s?sslmode=disable", user, pass, db)

	// Every pgwake service runs the image built from the repo's Dockerfile
	// and points at that database: migrate as the owner, the worker and the
	// producer as their roles of docs/grants.sql, which the roles service
	// creates after the migrations (TestComposeRoles runs its script).
	for name, role := range map[string]string{"migrate": "", "worker": "pgwake_worker", "producer": "pgwake_producer"} {
		s := c.Services[name]
		require.Equal(t, "pgwake:local", s.Image, name)
		want := wantURL
		if role != "" {
			want = fmt.Sprintf("postgres://%s:%s@postgres:5432/%s?sslmode=disable", role, role, db)
			require.Equal(t, "service_completed_successfully", s.DependsOn["roles"]["condition"], name)
		}
		require.Equal(t, want, s.Environment[envDatabaseURL], name)
	}
	roles := c.Services["roles"]
	require.Equal(t, pg.Image, roles.Image)
	require.Equal(t, "service_completed_successfully", roles.DependsOn["migrate"]["condition"])
	require.Equal(t, []string{"sh", "/roles.sh"}, roles.Entrypoint)
	require.ElementsMatch(t, []string{"./deploy/postgres/roles.sh:/roles.sh:ro", "./docs/grants.sql:/grants.sql:ro"}, roles.Volumes)
	require.Equal(t, map[string]string{"PGHOST": "postgres", "PGUSER": user, "PGPASSWORD": pass, "PGDATABASE": db}, roles.Environment)
	for _, name := range []string{"migrate", "worker", "producer"} {
		require.Equal(t, ".", c.Services[name].Build, "%s builds the image from the repo's Dockerfile (nothing to pull)", name)
	}
	require.Equal(t, []string{"migrate"}, commandList(t, c.Services["migrate"].Command))
	require.Equal(t, "service_healthy", c.Services["migrate"].DependsOn["postgres"]["condition"])

	df, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	require.Contains(t, string(df), "go build")
	require.Contains(t, string(df), "./cmd/pgwake")
	require.Contains(t, string(df), `ENTRYPOINT ["/sbin/tini", "--", "pgwake"]`)
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	require.NoError(t, err)
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(gomod))[1]
	require.Contains(t, string(df), "FROM golang:"+goVersion+"-", "the build image must match go.mod's go %s", goVersion)

	// The worker listens on all interfaces inside its container, on the
	// port that is published and that Prometheus scrapes.
	w := c.Services["worker"]
	args := commandList(t, w.Command)
	require.Equal(t, "worker", args[0])
	var metricsAddr string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--metrics-addr="); ok {
			metricsAddr = v
		}
	}
	host, port, err := net.SplitHostPort(metricsAddr)
	require.NoError(t, err)
	require.Empty(t, host, "inside the container the metrics must not bind to loopback")
	require.Equal(t, []string{"127.0.0.1:" + port + ":" + port}, w.Ports)
	// The worker exits at most --shutdown-timeout plus --term-grace after
	// SIGTERM (TestWorkerShutdownTakesTheTimeoutPlusTheTermGrace): the
	// grace period must cover both, or Docker kills it first.
	grace, err := time.ParseDuration(w.StopGrace)
	require.NoError(t, err, "stop_grace_period")
	shutdown, termGrace := 10*time.Second, 5*time.Second // the flags' defaults
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--shutdown-timeout="); ok {
			shutdown, err = time.ParseDuration(v)
			require.NoError(t, err)
		}
		if v, ok := strings.CutPrefix(a, "--term-grace="); ok {
			termGrace, err = time.ParseDuration(v)
			require.NoError(t, err)
		}
	}
	require.Greater(t, grace, shutdown+termGrace, "stop_grace_period must exceed --shutdown-timeout plus --term-grace")
	require.Contains(t, string(df), `"/sbin/tini", "--"`, "an init as PID 1 reaps what exec handlers leave behind")

	prom, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/prometheus.yml"))
	require.NoError(t, err)
	var pc struct {
		ScrapeConfigs []struct {
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal(prom, &pc))
	require.Len(t, pc.ScrapeConfigs, 1)
	require.Equal(t, "/metrics", pc.ScrapeConfigs[0].MetricsPath)
	require.Equal(t, []string{"worker:" + port}, pc.ScrapeConfigs[0].StaticConfigs[0].Targets)
	require.Contains(t, c.Services["prometheus"].Volumes, "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro")
	require.Equal(t, []string{"127.0.0.1:9090:9090"}, c.Services["prometheus"].Ports)

	// Grafana: provisioning mounted, the provider reads where the dashboards
	// are mounted, and the dashboard's datasource uid is provisioned.
	g := c.Services["grafana"]
	require.Equal(t, []string{"127.0.0.1:3000:3000"}, g.Ports)
	require.Contains(t, g.Volumes, "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro")
	require.Contains(t, g.Volumes, "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro")
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	pb, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/provisioning/dashboards/pgwake.yml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(pb, &prov))
	require.Equal(t, "/var/lib/grafana/dashboards", prov.Providers[0].Options.Path)
	var dsProv struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	db2, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/provisioning/datasources/prometheus.yml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(db2, &dsProv))
	require.Equal(t, "prometheus", dsProv.Datasources[0].Type)
	require.Equal(t, "http://prometheus:9090", dsProv.Datasources[0].URL)
	dash := loadDashboard(t)
	for _, p := range dash.Panels {
		require.Equal(t, dsProv.Datasources[0].UID, p.Datasource.UID, "panel %q", p.Title)
	}
}

// TestComposeWorkerCommand checks the compose worker's flags with the real
// binary: they must get past flag parsing to the connection attempt.
func TestComposeWorkerCommand(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	var args []string
	handlers := map[string]bool{}
	for _, a := range commandList(t, c.Services["worker"].Command) {
		a = uncompose(t, a)
		if v, ok := strings.CutPrefix(a, "--handler="); ok {
			kind, _, _ := strings.Cut(v, "=")
			handlers[kind] = true
		}
		args = append(args, a)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	// Bind metrics to loopback here: the flag's value is checked above.
	for i, a := range args {
		if strings.HasPrefix(a, "--metrics-addr=") {
			args[i] = "--metrics-addr=127.0.0.1:0"
		}
	}
	r := pgwakeEnv(t, []string{envDatabaseURL + "=postgres://u:p@" + closed + "/db"}, "", args...)
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "cannot connect to PostgreSQL")

	// The producer's batch lines parse, and every kind has a handler.
	script := uncompose(t, strings.Join(commandList(t, c.Services["producer"].Command), "\n"))
	lines := regexp.MustCompile(`echo '(\{.*\})'`).FindAllStringSubmatch(script, -1)
	require.NotEmpty(t, lines)
	var in strings.Builder
	for _, l := range lines {
		in.WriteString(l[1] + "\n")
	}
	jobs, _, err := readBatch(strings.NewReader(in.String()), queue.NewJob{})
	require.NoError(t, err)
	for _, j := range jobs {
		require.True(t, handlers[j.Kind], "producer enqueues kind %q that the worker has no handler for", j.Kind)
	}
	for _, m := range regexp.MustCompile(`enqueue --kind (\S+)`).FindAllStringSubmatch(script, -1) {
		require.True(t, handlers[m[1]], "producer enqueues kind %q that the worker has no handler for", m[1])
	}
}

type dashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/dashboards/pgwake.json"))
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(b, &d))
	return d
}

var metricNameRE = regexp.MustCompile(`pgwake_[a-z0-9_]+`)

// codeMetrics returns the metric names the Go code of the module defines.
func codeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	def := regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(pgwake_[a-z0-9_]+)"`)
	out := map[string]bool{}
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != repoRoot {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			if n := d.Name(); n == ".git" || n == "testdata" || n == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range def.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, out, "pgwake_worker_jobs_total", "the scan found the queue's metrics")
	return out
}

// baseMetric maps a series name to its metric (histogram suffixes removed).
func baseMetric(name string, known map[string]bool) string {
	if known[name] {
		return name
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suf); ok && known[b] {
			return b
		}
	}
	return name
}

func TestDashboardQueriesExistingMetrics(t *testing.T) {
	t.Parallel()
	known := codeMetrics(t)
	d := loadDashboard(t)
	require.Equal(t, "pgwake", d.UID)
	var titles []string
	used := map[string]bool{}
	check := func(where, expr string) {
		for _, n := range metricNameRE.FindAllString(expr, -1) {
			b := baseMetric(n, known)
			require.True(t, known[b], "%s queries %s, which no code defines", where, n)
			used[b] = true
		}
	}
	for _, p := range d.Panels {
		titles = append(titles, strings.ToLower(p.Title))
		require.NotEmpty(t, p.Targets, "panel %q", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr)
			check("panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		check("variable", v.Definition)
	}
	all := strings.Join(titles, " | ")
	for _, want := range []string{"queue depth", "throughput by outcome", "latency", "listener reconnects", "poll"} {
		require.Contains(t, all, want)
	}
	for _, m := range []string{"pgwake_queue_depth", "pgwake_worker_jobs_total", "pgwake_worker_wait_seconds",
		"pgwake_notify_reconnects_total", "pgwake_worker_claims_total"} {
		require.True(t, used[m], "the dashboard should chart %s", m)
	}
}

func TestMetricsReferenceMatchesCode(t *testing.T) {
	t.Parallel()
	known := codeMetrics(t)
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs/metrics.md"))
	require.NoError(t, err)
	documented := map[string]bool{}
	for _, n := range metricNameRE.FindAllString(string(b), -1) {
		base := baseMetric(n, known)
		require.True(t, known[base], "docs/metrics.md mentions %s, which no code defines", n)
		documented[base] = true
	}
	var missing []string
	for n := range known {
		if !documented[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "metrics defined in code but missing from docs/metrics.md")

	// Every claim source (the "source" label) is explained.
	src, err := os.ReadFile(filepath.Join(repoRoot, "queue/wake.go"))
	require.NoError(t, err)
	sources := regexp.MustCompile(`(?m)^\s*source[A-Z]\w*\s*=\s*"(\w+)"`).FindAllStringSubmatch(string(src), -1)
	require.NotEmpty(t, sources)
	for _, m := range sources {
		require.Contains(t, string(b), "`"+m[1]+"` (", "docs/metrics.md does not explain claim source %q", m[1])
	}
}

var updateCLIDocs = flag.Bool("update-cli-docs", false, "rewrite docs/cli.md's command sections from --help output")

// ownCommands are documented in docs/cli.md verbatim from their --help; the
// other registered commands must have a section there.
var ownCommands = []string{"migrate", "enqueue", "worker", "stats", "jobs", "demo"}

// TestCLIReference checks that docs/cli.md has a section for every
// registered command holding its --help output. Regenerate with
//
//	go test ./cmd/pgwake -run TestCLIReference -update-cli-docs
func TestCLIReference(t *testing.T) {
	path := filepath.Join(repoRoot, "docs/cli.md")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(b)
	help := func(name string) string {
		r := pgwake(t, "", name, "--help")
		require.Equal(t, 0, r.code)
		return r.stdout
	}
	section := func(name string) string { return "## pgwake " + name + "\n\n```\n" + help(name) + "```\n" }
	if *updateCLIDocs {
		head, _, ok := strings.Cut(doc, "\n## pgwake ")
		require.True(t, ok, "docs/cli.md has no command section to start from")
		var sb strings.Builder
		sb.WriteString(strings.TrimRight(head, "\n") + "\n")
		order := append([]string(nil), ownCommands...)
		for _, n := range commandNames() {
			if !contains(order, n) {
				order = append(order, n)
			}
		}
		for _, n := range order {
			sb.WriteString("\n" + section(n))
		}
		require.NoError(t, os.WriteFile(path, []byte(sb.String()), 0o644))
		return
	}
	for _, name := range commandNames() {
		require.Contains(t, doc, "\n## pgwake "+name+"\n", "docs/cli.md needs a section for %s; regenerate with -update-cli-docs", name)
	}
	for _, name := range ownCommands {
		require.Contains(t, doc, section(name), "docs/cli.md is out of date for %s; regenerate with: go test ./cmd/pgwake -run TestCLIReference -update-cli-docs", name)
	}
}
