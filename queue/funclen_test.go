package queue_test

import (
	"fmt"
	"go/ast"
	"go/token"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxFuncLines is the longest a production function may be, from its func
// line to its closing brace, in the parts longFuncDirs names.
const maxFuncLines = 80

// longFuncDirs are the trees (from the module root) whose production
// functions stay within maxFuncLines: the runtime (queue, notify, events)
// and the commands' code (cmd/pgwake: wiring and presentation; the bench,
// the demo and the exec handler it runs).
var longFuncDirs = []string{"queue", "notify", "events", filepath.Join("cmd", "pgwake"),
	filepath.Join("internal", "bench"), filepath.Join("internal", "demo"), filepath.Join("internal", "exechandler")}

// A reader can hold each function of the runtime and the commands at once:
// none is over maxFuncLines lines.
func TestNoFunctionOver80Lines(t *testing.T) {
	t.Parallel()
	var long []string
	for _, dir := range longFuncDirs {
		eachProductionFile(t, dir, nil, func(fset *token.FileSet, f *ast.File) {
			long = append(long, longFuncs(fset, f)...)
		})
	}
	require.Empty(t, long, "functions over %d lines: split them by concept", maxFuncLines)
}

// longFuncs returns the functions of f over maxFuncLines lines, with their
// positions and lengths.
func longFuncs(fset *token.FileSet, f *ast.File) []string {
	var long []string
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		from, to := fset.Position(fd.Pos()), fset.Position(fd.End())
		if n := to.Line - from.Line + 1; n > maxFuncLines {
			long = append(long, fmt.Sprintf("%s: %s, %d lines", from, fd.Name.Name, n))
		}
	}
	return long
}
