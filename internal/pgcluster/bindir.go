// Package pgcluster starts throwaway PostgreSQL clusters (initdb + pg_ctl)
// for tests and for `pgwake demo`. A cluster lives in a fresh temporary
// directory, listens on 127.0.0.1 on a free port with a random superuser
// password (trusting only its Unix socket, in a directory no other OS user
// can enter), has wal_level=logical and is thrown away by Stop.
package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ErrNoServerBinaries is wrapped by FindBinDir (and Start) when no
// PostgreSQL server binaries (initdb, pg_ctl) can be found.
var ErrNoServerBinaries = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found")

// EnvBinDir names the environment variable that, when set, overrides the
// search for the server binaries.
const EnvBinDir = "PGWAKE_PG_BIN"

const installHint = "install them (Debian/Ubuntu: `apt-get install postgresql`; " +
	"Fedora/RHEL: `dnf install postgresql-server`; macOS: `brew install postgresql`), " +
	"set " + EnvBinDir + " to the directory holding initdb and pg_ctl, " +
	"or use an existing server instead (e.g. `docker compose up -d` and set DATABASE_URL / TEST_DATABASE_URL); " +
	"the server needs wal_level=logical"

// FindBinDir returns the directory holding initdb and pg_ctl. It tries, in
// order: $PGWAKE_PG_BIN; `pg_config --bindir` if that directory has initdb;
// the highest-version /usr/lib/postgresql/*/bin; initdb on $PATH.
// Errors wrap ErrNoServerBinaries.
func FindBinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if !hasServerBinaries(dir) {
			return "", fmt.Errorf("%w: %s=%q has no initdb and pg_ctl; %s", ErrNoServerBinaries, EnvBinDir, dir, installHint)
		}
		return dir, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); dir != "" && hasServerBinaries(dir) {
			return dir, nil
		}
	}
	if dir := highestDebianBinDir("/usr/lib/postgresql"); dir != "" {
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if dir := filepath.Dir(p); hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w (looked at $%s, `pg_config --bindir`, /usr/lib/postgresql/*/bin and $PATH); %s",
		ErrNoServerBinaries, EnvBinDir, installHint)
}

// highestDebianBinDir returns root/<version>/bin for the highest numeric
// version that has the server binaries, or "".
func highestDebianBinDir(root string) string {
	matches, _ := filepath.Glob(filepath.Join(root, "*", "bin"))
	type cand struct {
		dir string
		ver []int
	}
	var cands []cand
	for _, m := range matches {
		if !hasServerBinaries(m) {
			continue
		}
		cands = append(cands, cand{m, parseVersion(filepath.Base(filepath.Dir(m)))})
	}
	sort.Slice(cands, func(i, j int) bool { return versionLess(cands[j].ver, cands[i].ver) })
	if len(cands) == 0 {
		return ""
	}
	return cands[0].dir
}

// parseVersion turns "15" or "9.6" into {15} or {9, 6}; non-numeric parts
// count as -1 so they sort last.
func parseVersion(s string) []int {
	parts := strings.Split(s, ".")
	v := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			n = -1
		}
		v[i] = n
	}
	return v
}

func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

func hasServerBinaries(dir string) bool {
	return isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "pg_ctl"))
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
