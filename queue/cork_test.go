package queue_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// corkHelperEnv makes the test binary a process that corks its connection,
// writes an INSERT into the table the variable names, and dies at once
// (corkHelperMain).
const corkHelperEnv = "PGWAKE_TEST_CORK_TABLE"

func corkHelperMain() int {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("PGWAKE_TEST_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	pc := conn.PgConn()
	queue.Cork(pc.Conn())
	q := "INSERT INTO " + os.Getenv(corkHelperEnv) + " VALUES ('" + os.Getenv("PGWAKE_TEST_HOW") + "')"
	p := pc.StartPipeline(ctx)
	p.SendQueryParams(q, nil, nil, nil, nil)
	if err := p.Sync(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	if os.Getenv("PGWAKE_TEST_HOW") == "kill" {
		killSelf()
	}
	os.Exit(0)
	return 0
}

// What a process wrote into a corked socket (the attempt record, before its
// handler starts) reaches the server and commits although the process dies
// before anything uncorks it: exit and SIGKILL, five times each.
func TestCorkedWriteSurvivesItsProcess(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	table := fmt.Sprintf("cork_%d", time.Now().UnixNano())
	_, err := pool.Exec(ctx, `CREATE UNLOGGED TABLE `+table+` (how text)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })
	for range 5 {
		for _, how := range []string{"exit", "kill"} {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), corkHelperEnv+"="+table, "PGWAKE_TEST_URL="+pool.Config().ConnString(), "PGWAKE_TEST_HOW="+how)
			cmd.Stderr = os.Stderr
			_ = cmd.Run() // it dies
		}
	}
	var n int
	waitFor(t, 10*time.Second, "ten rows", func() bool {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		return n == 10
	})
}

// BenchmarkCorkedWrite times one write of a 5-byte Sync message to an
// idle loopback connection, 10 ms after the last, plain and into a corked
// socket (uncorked after the timed write), and reports the medians in µs.
// The corked write is what sendStarts puts between a claim's answer and
// the first handler.
//
//	go test -run '^$' -bench BenchmarkCorkedWrite -benchtime 300x ./queue/
func BenchmarkCorkedWrite(b *testing.B) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.Pool(b).Config().ConnConfig.ConnString())
	require.NoError(b, err)
	defer conn.Close(ctx)
	nc := conn.PgConn().Conn()
	sync := []byte{'S', 0, 0, 0, 4}
	buf := make([]byte, 64)
	var plain, corked []float64
	write := func(corkIt bool) float64 {
		time.Sleep(10 * time.Millisecond)
		uncork := func() {}
		if corkIt {
			uncork = queue.Cork(nc)
		}
		t := time.Now()
		_, err := nc.Write(sync)
		d := time.Since(t)
		uncork()
		require.NoError(b, err)
		_, err = nc.Read(buf) // ReadyForQuery
		require.NoError(b, err)
		return float64(d.Nanoseconds()) / 1e3
	}
	for b.Loop() {
		plain = append(plain, write(false))
		corked = append(corked, write(true))
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(median(plain), "plain-µs/write")
	b.ReportMetric(median(corked), "corked-µs/write")
}
