package queue_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// pgwakeTableNames are the tables of the migrations (migrations/sql).
const pgwakeTableNames = `jobs|events|attempts|waiters|unique_periods|periodic|paused_queues|event_watchers|wake_salt|watermill_subscriptions|schema_migrations`

// pgwakeTables matches a string that is one table's name.
var pgwakeTables = regexp.MustCompile(`^(` + pgwakeTableNames + `)$`)

// tableSQL matches a statement on one of them: a keyword, then the table's
// name, bare or after a schema (a name, a quoted name, a format verb such
// as %s, or an expression spliced in with +, which sqlLiterals writes as
// "?").
var tableSQL = regexp.MustCompile(`(?i)\b(from|join|into|update|table|truncate|vacuum|analyze)\s+(only\s+)?("?[a-z_0-9]+"?\.|%[a-z]\.|\?\.)?"?(` + pgwakeTableNames + `)\b`)

// The store is the one home of SQL against pgwake's tables: no production
// file outside queue, events and migrations quotes a table's name
// (sqlident.Quote, pgx.Identifier) or has a string with a statement on one.
func TestNoSQLAgainstTheTablesOutsideTheStore(t *testing.T) {
	t.Parallel()
	var found []string
	// bench/peers is a module of its own.
	eachProductionFile(t, ".", []string{"queue", "events", "migrations", filepath.Join("bench", "peers")}, func(fset *token.FileSet, f *ast.File) {
		found = append(found, sqlOnTables(fset, f)...)
	})
	require.Empty(t, found, "SQL against pgwake's tables outside queue, events and migrations: call the store (queue's read API, SeedFinished, ...)")
}

// The matcher of TestNoSQLAgainstTheTablesOutsideTheStore finds each way a
// statement on a table has been written, and passes SQL on other tables
// and prose that names a table.
func TestSQLOnTablesMatcher(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		src   string
		found bool
	}{
		{"`SELECT count(*) FROM jobs`", true},
		{"`SELECT id FROM pgwake.jobs WHERE state = 'pending'`", true},
		{"`DELETE FROM \"pgwake\".\"events\" WHERE id < $1`", true},
		{"`UPDATE ` + q + `.attempts SET x = 1`", true},
		{"\"SELECT 1 FROM \" + schema + \".waiters\"", true},
		{`fmt.Sprintf("INSERT INTO %s.jobs (kind) VALUES ($1)", q)`, true},
		{"`SELECT * FROM a JOIN periodic p ON true`", true},
		{"`TRUNCATE ONLY paused_queues`", true},
		{"`VACUUM ANALYZE ` + t + `.jobs`", true},
		{`sqlident.Quote(schema, "jobs")`, true},
		{`pgx.Identifier{schema, "events"}.Sanitize()`, true},
		{"`INSERT INTO ` + sqlident.Quote(schema, \"demo_effects\") + ` (job_id) VALUES ($1)`", false},
		{"`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`", false},
		{`"events examined per DELETE statement, in id order"`, false},
		{`"publication on the events table"`, false},
		{`"jobs"`, false}, // a name alone, not quoted into SQL: a label, a flag
		{"`SELECT ` + sqlident.Quote(schema, \"enqueue\") + `($1)`", false},
	} {
		src := "package p\n\nvar _ = " + c.src + "\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "sample.go", src, 0)
		require.NoError(t, err, c.src)
		found := sqlOnTables(fset, f)
		require.Equal(t, c.found, len(found) > 0, "%s: found %q", c.src, found)
	}
}

// sqlOnTables returns the strings of f, with their positions, that quote a
// pgwake table's name or hold a statement on one. A chain of + is read as
// one string, its non-literal operands written as "?".
func sqlOnTables(fset *token.FileSet, f *ast.File) []string {
	var found []string
	report := func(n ast.Node, s string) {
		found = append(found, fset.Position(n.Pos()).String()+": "+s)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.BinaryExpr:
			if x.Op != token.ADD {
				return true
			}
			if s, ok := concat(x); ok && tableSQL.MatchString(s) {
				report(x, s)
				return false // one report for the chain
			}
		case *ast.BasicLit:
			if x.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(x.Value)
			if err != nil {
				return true
			}
			if pgwakeTables.MatchString(s) && quotedName(f, x) || tableSQL.MatchString(s) {
				report(x, s)
			}
		}
		return true
	})
	return found
}

// concat reads a chain of + as one string, each operand that is not a
// string literal written as "?"; ok is false when the chain has no string
// literal (an addition of numbers).
func concat(e ast.Expr) (s string, ok bool) {
	switch x := e.(type) {
	case *ast.ParenExpr:
		return concat(x.X)
	case *ast.BinaryExpr:
		if x.Op == token.ADD {
			l, lok := concat(x.X)
			r, rok := concat(x.Y)
			return l + r, lok || rok
		}
	case *ast.BasicLit:
		if x.Kind == token.STRING {
			if v, err := strconv.Unquote(x.Value); err == nil {
				return v, true
			}
		}
	}
	return "?", false
}

// quotedName reports whether lit is an argument of sqlident.Quote or an
// element of a pgx.Identifier in f.
func quotedName(f *ast.File, lit *ast.BasicLit) bool {
	quoted := false
	ast.Inspect(f, func(n ast.Node) bool {
		var args []ast.Expr
		var fun ast.Expr
		switch x := n.(type) {
		case *ast.CallExpr:
			args, fun = x.Args, x.Fun
		case *ast.CompositeLit:
			args, fun = x.Elts, x.Type
		default:
			return !quoted
		}
		sel, ok := fun.(*ast.SelectorExpr)
		if !ok || !(sel.Sel.Name == "Quote" || sel.Sel.Name == "Identifier") {
			return true
		}
		for _, a := range args {
			if a == ast.Expr(lit) {
				quoted = true
			}
		}
		return !quoted
	})
	return quoted
}
