package queue_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// pgwakeTables are the tables of the migrations.
var pgwakeTables = regexp.MustCompile(`^(jobs|events|attempts|waiters|unique_periods|periodic|paused_queues|event_watchers|wake_salt|watermill_subscriptions|schema_migrations)$`)

// tableSQL is a string that names one of them after a keyword of a
// statement.
var tableSQL = regexp.MustCompile(`(?i)\b(from|join|into|update|table|truncate|vacuum|analyze)\s+("?[a-z_0-9]+"?\.)?"?(jobs|events|attempts|waiters|unique_periods|periodic|paused_queues|event_watchers|wake_salt|watermill_subscriptions|schema_migrations)\b`)

// The store is the one home of SQL against pgwake's tables: no production
// file outside queue, events and migrations quotes a table's name
// (sqlident.Quote, pgx.Identifier) or has a string with a statement on one.
func TestNoSQLAgainstTheTablesOutsideTheStore(t *testing.T) {
	t.Parallel()
	root := ".."
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "queue", "events", "migrations", filepath.Join("bench", "peers"), ".git":
				return filepath.SkipDir // bench/peers is a module of its own
			}
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			if pgwakeTables.MatchString(s) && quotedName(f, lit) || tableSQL.MatchString(s) {
				found = append(found, fset.Position(lit.Pos()).String()+": "+s)
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, found, "SQL against pgwake's tables outside queue, events and migrations: call the store (queue's read API, SeedFinished, ...)")
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
