// Command watermill compares pgwake's Watermill Pub/Sub (events/pubsub) with
// watermill-sql v4 on the same PostgreSQL in the same run:
//
//   - publish-to-handler latency (p50, p99, max) at a steady publish rate;
//   - database load while a subscriber idles: statements per second seen by
//     pg_stat_statements and transactions per second from pg_stat_database;
//   - the Publish call's own latency, and drain throughput from a backlog
//     (-drain messages published in batches of 100, then consumed).
//
// Each system runs in a database of its own (created and dropped per run), so
// the counters of one never include the other's. watermill-sql runs at its
// default poll interval (1s) and at a tuned one (-tuned, 10ms by default);
// pgwake with its defaults (MaxBatch 64) and with MaxBatch 1.
// Results are medians over -runs runs.
//
//	cd bench/peers && go run ./watermill                  # throwaway cluster
//	cd bench/peers && go run ./watermill -db postgres://... # existing server
//
// With -db, pg_stat_statements must be in shared_preload_libraries for the
// statements column (otherwise it reads n/a). -only NAME runs the systems
// whose name contains NAME, -skip NAME the others; -cpuprofile FILE writes a Go CPU profile of each
// drain to FILE.<system>.<run>.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/pgcluster"
	"github.com/pgwake/pgwake/migrations"
)

type options struct {
	db       string
	rate     int
	duration time.Duration
	idle     time.Duration
	runs     int
	tuned    time.Duration
	top      bool
	drain    int
	only     string
	skip     string
	cpuprof  string
	dataDir  string // the throwaway cluster's, for its CPU time; "" with -db
}

func main() {
	var o options
	flag.StringVar(&o.db, "db", "", "PostgreSQL URL of a superuser (default: start a throwaway cluster)")
	flag.IntVar(&o.rate, "rate", 100, "messages published per second")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "publishing time per system and run")
	flag.DurationVar(&o.idle, "idle", 20*time.Second, "idle window per system and run for the load figures")
	flag.IntVar(&o.runs, "runs", 3, "runs; the report shows medians")
	flag.DurationVar(&o.tuned, "tuned", 10*time.Millisecond, "watermill-sql's tuned poll interval")
	flag.BoolVar(&o.top, "top", false, "log the statements each system ran while idle")
	flag.IntVar(&o.drain, "drain", 5000, "messages published in batches of 100 before the subscriber drains them (0: skip)")
	flag.StringVar(&o.only, "only", "", "run only the systems whose name contains this")
	flag.StringVar(&o.skip, "skip", "", "skip the systems whose name contains this")
	flag.StringVar(&o.cpuprof, "cpuprofile", "", "write a Go CPU profile of the drains to this file")
	flag.Parse()
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

// system is one Pub/Sub under test, set up in its own database.
type system struct {
	name  string
	setup func(ctx context.Context, pool *pgxpool.Pool) (message.Publisher, message.Subscriber, error)
}

type result struct {
	p50, p99, max  time.Duration
	pubP50, pubP99 time.Duration // the Publish call alone
	drainPerSec    float64       // messages/s a subscriber drains from a backlog
	// CPU time per drained message: this process (the subscriber and the
	// bench) and the cluster's processes; -1 when unknown (-db).
	drainGoCPU, drainPGCPU time.Duration
	received               int
	stmtPerSec             float64 // -1: pg_stat_statements unavailable
	txPerSec               float64
}

func run(o options) error {
	ctx := context.Background()
	url := o.db
	if url == "" {
		conf := map[string]string{
			"shared_preload_libraries": "pg_stat_statements",
			"pg_stat_statements.track": "all",
		}
		if o.top {
			conf["pg_stat_statements.track_planning"] = "on"
		}
		c, err := pgcluster.Start(ctx, pgcluster.Options{ExtraConf: conf})
		if err != nil {
			return err
		}
		defer c.Stop() //nolint:errcheck // best effort at exit
		url = c.URL
		o.dataDir = c.DataDir
	}
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer admin.Close()
	_, stmtErr := admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	if stmtErr == nil {
		_, stmtErr = admin.Exec(ctx, `SELECT count(*) FROM pg_stat_statements`)
	}
	if stmtErr != nil {
		log.Printf("pg_stat_statements unavailable (%v): statements/s will read n/a", stmtErr)
	}
	var version string
	if err := admin.QueryRow(ctx, `SHOW server_version`).Scan(&version); err != nil {
		return err
	}

	systems := []system{
		{"pgwake events/pubsub, defaults", setupPgwake(0)},
		{"pgwake events/pubsub, MaxBatch 1", setupPgwake(1)},
		{"watermill-sql v4, poll 1s (default)", setupWatermillSQL(time.Second)},
		{"watermill-sql v4, poll " + o.tuned.String() + " (tuned)", setupWatermillSQL(o.tuned)},
	}
	if o.only != "" {
		systems = slices.DeleteFunc(systems, func(s system) bool { return !strings.Contains(s.name, o.only) })
	}
	if o.skip != "" {
		systems = slices.DeleteFunc(systems, func(s system) bool { return strings.Contains(s.name, o.skip) })
	}
	results := make([][]result, len(systems))
	for r := range o.runs {
		for i, s := range systems {
			db := fmt.Sprintf("bench_wm_%d_%d", i, r)
			prof := ""
			if o.cpuprof != "" {
				prof = fmt.Sprintf("%s.%d.%d", o.cpuprof, i, r+1)
			}
			res, err := measure(ctx, admin, url, db, s, o, stmtErr == nil, prof)
			if err != nil {
				return fmt.Errorf("%s, run %d: %w", s.name, r+1, err)
			}
			log.Printf("run %d %-55s p50 %-10s p99 %-10s max %-10s publish p50 %-10s p99 %-10s idle %.1f stmt/s %.1f tx/s drain %.0f msg/s (%d msgs) drain CPU/msg Go %s PostgreSQL %s",
				r+1, s.name, res.p50.Round(10*time.Microsecond), res.p99.Round(10*time.Microsecond),
				res.max.Round(10*time.Microsecond), res.pubP50.Round(10*time.Microsecond), res.pubP99.Round(10*time.Microsecond),
				res.stmtPerSec, res.txPerSec, res.drainPerSec, res.received, res.drainGoCPU, res.drainPGCPU)
			results[i] = append(results[i], res)
		}
	}

	fmt.Printf("\nPostgreSQL %s; %d msg/s for %s per system; idle window %s; medians of %d runs\n\n",
		version, o.rate, o.duration, o.idle, o.runs)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "system\tp50\tp99\tmax\tPublish call p50\tPublish call p99\tidle statements/s\tidle transactions/s\tdrain msg/s\tdrain CPU/msg Go\tdrain CPU/msg PostgreSQL\t")
	for i, s := range systems {
		rs := results[i]
		stmt := "n/a"
		if stmtErr == nil {
			stmt = fmt.Sprintf("%.1f", median(rs, func(r result) float64 { return r.stmtPerSec }))
		}
		dur := func(f func(r result) time.Duration) time.Duration {
			return time.Duration(median(rs, func(r result) float64 { return float64(f(r)) })).Round(10 * time.Microsecond)
		}
		cpu := func(f func(r result) time.Duration) time.Duration {
			return time.Duration(median(rs, func(r result) float64 { return float64(f(r)) })).Round(100 * time.Nanosecond)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.0f\t%s\t%s\t\n", s.name,
			dur(func(r result) time.Duration { return r.p50 }),
			dur(func(r result) time.Duration { return r.p99 }),
			dur(func(r result) time.Duration { return r.max }),
			dur(func(r result) time.Duration { return r.pubP50 }),
			dur(func(r result) time.Duration { return r.pubP99 }),
			stmt,
			median(rs, func(r result) float64 { return r.txPerSec }),
			median(rs, func(r result) float64 { return r.drainPerSec }),
			cpu(func(r result) time.Duration { return r.drainGoCPU }),
			cpu(func(r result) time.Duration { return r.drainPGCPU }))
	}
	return w.Flush()
}

func median(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

const topic = "bench.latency"

// measure runs one system in a fresh database: idle load first (with the
// subscriber running and nothing published), then latency at the steady rate.
func measure(ctx context.Context, admin *pgxpool.Pool, url, db string, s system, o options, stmts bool, prof string) (result, error) {
	dbq := pgx.Identifier{db}.Sanitize()
	if _, err := admin.Exec(ctx, `DROP DATABASE IF EXISTS `+dbq+` WITH (FORCE)`); err != nil {
		return result{}, err
	}
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+dbq); err != nil {
		return result{}, err
	}
	defer admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+dbq+` WITH (FORCE)`) //nolint:errcheck // best effort

	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return result{}, err
	}
	cfg.ConnConfig.Database = db
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()

	pub, sub, err := s.setup(ctx, pool)
	if err != nil {
		return result{}, err
	}
	defer pub.Close() //nolint:errcheck // closed below; idempotent
	defer sub.Close() //nolint:errcheck // closed below; idempotent
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := sub.Subscribe(sctx, topic)
	if err != nil {
		return result{}, err
	}

	var mu sync.Mutex
	var lat []time.Duration
	got := make(chan struct{}, 1<<16)
	var wg sync.WaitGroup
	wg.Go(func() {
		for m := range ch {
			sent, err := strconv.ParseInt(m.Metadata.Get("sent_at_ns"), 10, 64)
			d := time.Since(time.Unix(0, sent))
			m.Ack()
			if err != nil {
				continue
			}
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
			got <- struct{}{}
		}
	})
	defer wg.Wait()
	defer cancel()

	// Warm up: one message end to end (creates watermill-sql's tables,
	// proves the subscription runs).
	if err := publish(pub); err != nil {
		return result{}, err
	}
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		return result{}, errors.New("warm-up message not received within 30s")
	}
	mu.Lock()
	lat = lat[:0]
	mu.Unlock()

	// Idle load.
	time.Sleep(2 * time.Second) // let the stats of the warm-up settle
	st0, tx0, err := counters(ctx, admin, db, stmts)
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	time.Sleep(o.idle)
	st1, tx1, err := counters(ctx, admin, db, stmts)
	if err != nil {
		return result{}, err
	}
	secs := time.Since(start).Seconds()
	if o.top && stmts {
		logTop(ctx, admin, db)
	}
	res := result{stmtPerSec: -1, txPerSec: float64(tx1-tx0) / secs}
	if stmts {
		res.stmtPerSec = float64(st1-st0) / secs
	}

	// Latency at a steady rate.
	n := int(float64(o.rate) * o.duration.Seconds())
	tick := time.NewTicker(time.Second / time.Duration(o.rate))
	pubDur := make([]time.Duration, 0, n)
	for range n {
		<-tick.C
		t0 := time.Now()
		if err := publish(pub); err != nil {
			tick.Stop()
			return result{}, err
		}
		pubDur = append(pubDur, time.Since(t0))
	}
	tick.Stop()
	slices.Sort(pubDur)
	res.pubP50, res.pubP99 = pubDur[len(pubDur)/2], pubDur[(len(pubDur)*99)/100]
	deadline := time.After(30 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-got:
		case <-deadline:
			i = n
		}
	}
	mu.Lock()
	ls := slices.Clone(lat)
	mu.Unlock()
	if len(ls) < n {
		return result{}, fmt.Errorf("received %d of %d messages", len(ls), n)
	}
	if o.top && stmts {
		log.Printf("statements after the latency phase (cumulative):")
		logTop(ctx, admin, db)
	}
	slices.Sort(ls)
	res.received = len(ls)
	res.p50 = ls[len(ls)/2]
	res.p99 = ls[(len(ls)*99)/100]
	res.max = ls[len(ls)-1]

	if o.drain > 0 {
		// Backlog: stop consuming, publish, then time the drain.
		cancel()
		wg.Wait()
		for len(got) > 0 {
			<-got
		}
		for i := 0; i < o.drain; i += 100 {
			batch := make([]*message.Message, 0, 100)
			for j := i; j < min(i+100, o.drain); j++ {
				batch = append(batch, message.NewMessage(watermill.NewUUID(), []byte(`{"n":1}`)))
			}
			if err := pub.Publish(topic, batch...); err != nil {
				return result{}, err
			}
		}
		if o.top && stmts {
			log.Printf("statements of the backlog's publish (cumulative with the above):")
			logTop(ctx, admin, db)
			if _, err := admin.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = $1), 0)`, db); err != nil {
				return result{}, err
			}
		}
		dctx, dcancel := context.WithCancel(ctx)
		defer dcancel()
		ch, err := sub.Subscribe(dctx, topic)
		if err != nil {
			return result{}, err
		}
		stopProf, err := startProfile(prof)
		if err != nil {
			return result{}, err
		}
		go0, pg0 := goCPU(), pgCPU(o.dataDir)
		start := time.Now()
		for i := 0; i < o.drain; i++ {
			select {
			case m := <-ch:
				m.Ack()
			case <-time.After(60 * time.Second):
				return result{}, fmt.Errorf("drain: %d of %d after a 60s gap", i, o.drain)
			}
		}
		res.drainPerSec = float64(o.drain) / time.Since(start).Seconds()
		res.drainGoCPU = (goCPU() - go0) / time.Duration(o.drain)
		res.drainPGCPU = -1
		if pg1 := pgCPU(o.dataDir); pg0 >= 0 && pg1 >= 0 {
			res.drainPGCPU = (pg1 - pg0) / time.Duration(o.drain)
		}
		stopProf()
		if o.top && stmts {
			log.Printf("statements of the drain:")
			logTop(ctx, admin, db)
		}
		dcancel()
		for range ch {
		}
	}
	cancel()
	if err := sub.Close(); err != nil {
		return result{}, err
	}
	return res, pub.Close()
}

// startProfile starts a Go CPU profile into file (none when file is "") and
// returns the function that stops it.
func startProfile(file string) (func(), error) {
	if file == "" {
		return func() {}, nil
	}
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func publish(pub message.Publisher) error {
	payload, _ := json.Marshal(map[string]int64{"n": time.Now().UnixNano()})
	m := message.NewMessage(watermill.NewUUID(), payload)
	m.Metadata.Set("sent_at_ns", strconv.FormatInt(time.Now().UnixNano(), 10))
	return pub.Publish(topic, m)
}

// counters returns the statements (pg_stat_statements calls) and transactions
// (commits + rollbacks) recorded for database db so far. The admin pool's own
// queries run in another database and are not counted.
func counters(ctx context.Context, admin *pgxpool.Pool, db string, stmts bool) (st, tx int64, err error) {
	if stmts {
		if err := admin.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
			WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)`, db).Scan(&st); err != nil {
			return 0, 0, err
		}
	}
	// pg_stat_database is fed by each backend at most once a second (and by
	// idle backends later); the idle window is long enough for that to wash out.
	err = admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, db).Scan(&tx)
	return st, tx, err
}

// logTop logs the statements run in database db, most frequent first.
func logTop(ctx context.Context, admin *pgxpool.Pool, db string) {
	rows, err := admin.Query(ctx, `SELECT calls, total_exec_time + total_plan_time, total_plan_time, left(regexp_replace(query, '\s+', ' ', 'g'), 100) FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) ORDER BY calls DESC LIMIT 16`, db)
	if err != nil {
		log.Print(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var calls int64
		var total, plan float64
		var q string
		if err := rows.Scan(&calls, &total, &plan, &q); err == nil {
			log.Printf("  %6d  %9.1fms  %7.3fms/call (planning %7.3fms/call)  %s", calls, total, total/float64(calls), plan/float64(calls), q)
		}
	}
}

func setupPgwake(maxBatch int) func(ctx context.Context, pool *pgxpool.Pool) (message.Publisher, message.Subscriber, error) {
	return func(ctx context.Context, pool *pgxpool.Pool) (message.Publisher, message.Subscriber, error) {
		if _, err := migrations.Up(ctx, pool, migrations.DefaultSchema); err != nil {
			return nil, nil, err
		}
		pub, err := pubsub.NewPublisher(pool, pubsub.PublisherConfig{})
		if err != nil {
			return nil, nil, err
		}
		sub, err := pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{MaxBatch: maxBatch})
		if err != nil {
			return nil, nil, err
		}
		return pub, sub, sub.SubscribeInitialize(topic)
	}
}

func setupWatermillSQL(poll time.Duration) func(ctx context.Context, pool *pgxpool.Pool) (message.Publisher, message.Subscriber, error) {
	return func(ctx context.Context, pool *pgxpool.Pool) (message.Publisher, message.Subscriber, error) {
		db := wmsql.BeginnerFromPgx(pool)
		pub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{
			SchemaAdapter:        wmsql.DefaultPostgreSQLSchema{},
			AutoInitializeSchema: true,
		}, watermill.NopLogger{})
		if err != nil {
			return nil, nil, err
		}
		sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
			ConsumerGroup:    "bench",
			PollInterval:     poll,
			SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{},
			OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
			InitializeSchema: true,
		}, watermill.NopLogger{})
		if err != nil {
			return nil, nil, err
		}
		return pub, sub, sub.SubscribeInitialize(topic)
	}
}

// goCPU is the CPU time this process has used (user and system).
func goCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pgCPU is the CPU time (user and system) used so far by the live processes
// of the cluster in dataDir: its postmaster and the postmaster's children,
// read from /proc (Linux). -1 when unknown.
func pgCPU(dataDir string) time.Duration {
	if dataDir == "" {
		return -1
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return -1
	}
	pm, _, _ := strings.Cut(string(b), "\n")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	const userHZ = 100 // Linux's USER_HZ, the unit of /proc/<pid>/stat times
	var ticks int64
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command, which ends at the last ')': state,
		// ppid, ... utime is field 14 of the line, stime 15.
		_, rest, ok := strings.Cut(string(stat), ") ")
		f := strings.Fields(rest)
		if !ok || len(f) < 13 || (e.Name() != pm && f[1] != pm) {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
	}
	return time.Duration(ticks) * time.Second / userHZ
}
