package pgtest

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { Main(m) }

var schemaRE = regexp.MustCompile(`^t_[a-z0-9_]*[a-z0-9]_[0-9a-f]{8}$`)

func TestURLAndCluster(t *testing.T) {
	if URL() == "" {
		t.Fatal("empty URL")
	}
	if os.Getenv(EnvURL) == "" {
		c := Cluster()
		if c == nil || c.URL != URL() {
			t.Fatalf("Cluster() = %v, URL %q", c, URL())
		}
	} else if Cluster() != nil {
		t.Fatal("Cluster() != nil with $TEST_DATABASE_URL")
	}
}

func TestPool(t *testing.T) {
	p := Pool(t)
	if p != Pool(t) {
		t.Fatal("Pool is not shared")
	}
	if got := p.Config().MaxConns; got != SharedPoolMaxConns {
		t.Errorf("MaxConns = %d", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var one int
	if err := p.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: %d, %v", one, err)
	}
	if Cluster() != nil {
		var lvl string
		if err := p.QueryRow(ctx, "SHOW wal_level").Scan(&lvl); err != nil || lvl != "logical" {
			t.Fatalf("wal_level %q, %v", lvl, err)
		}
	}
}

func TestNewPool(t *testing.T) {
	var p *pgxpool.Pool
	t.Run("inner", func(t *testing.T) {
		p = NewPool(t, func(c *pgxpool.Config) {
			c.MaxConns = 2
			c.ConnConfig.RuntimeParams["application_name"] = "pgtest_newpool"
		})
		if p == Pool(t) {
			t.Fatal("NewPool returned the shared pool")
		}
		var name string
		if err := p.QueryRow(context.Background(), "SHOW application_name").Scan(&name); err != nil || name != "pgtest_newpool" {
			t.Fatalf("application_name %q, %v", name, err)
		}
	})
	// Closed by the subtest's cleanup.
	if err := p.Ping(context.Background()); err == nil {
		t.Fatal("pool still open after its test's cleanup")
	}
}

func TestSchema(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := Pool(t)
	exists := func(name string) bool {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	seen := map[string]bool{}
	for i := 0; i < 50; i++ {
		s := Schema(t)
		if len(s) > SchemaMaxLen || !schemaRE.MatchString(s) {
			t.Fatalf("bad schema name %q", s)
		}
		if !strings.HasPrefix(s, "t_testschema_") {
			t.Errorf("%q does not carry the test name", s)
		}
		if seen[s] {
			t.Fatalf("duplicate %q", s)
		}
		seen[s] = true
		if exists(s) {
			t.Fatalf("%q already exists", s)
		}
	}

	// Long, odd subtest names are cut and sanitized; the schema is dropped
	// at the subtest's cleanup.
	var created string
	t.Run("A Very/Long Sub-Test Name With ÜNICODE & Symbols!!! and more words", func(t *testing.T) {
		created = Schema(t)
		if len(created) > SchemaMaxLen || !schemaRE.MatchString(created) {
			t.Fatalf("bad schema name %q", created)
		}
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{created}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{created, "x"}.Sanitize()+" (id int)"); err != nil {
			t.Fatal(err)
		}
	})
	if created == "" {
		t.FailNow()
	}
	if exists(created) {
		t.Fatalf("%q not dropped at cleanup", created)
	}
}

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"TestFoo":                               "testfoo",
		"TestFoo/sub_case#01":                   "testfoo_sub_case_01",
		"__a--b__":                              "a_b",
		"日本":                                    "",
		"abcdefghijklmnopqrstuvwxyz_abcdefghij": "abcdefghijklmnopqrstuvwxyz_a",
		"abcdefghijklmnopqrstuvwxyz1_xyz":       "abcdefghijklmnopqrstuvwxyz1",
	} {
		if got := sanitize(in, 28); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}
