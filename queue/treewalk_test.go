package queue_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// eachProductionFile parses every .go file that is not a test below dir (a
// path from the module root; "." for all of it), except in testdata, .git
// and the folders skip names (paths from the module root), and calls fn
// with it.
func eachProductionFile(t *testing.T, dir string, skip []string, fn func(*token.FileSet, *ast.File)) {
	t.Helper()
	root := ".."
	err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if d.Name() == "testdata" || d.Name() == ".git" || slices.Contains(skip, rel) {
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
		fn(fset, f)
		return nil
	})
	require.NoError(t, err)
}
