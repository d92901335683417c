package bench

import (
	"os/exec"
	"runtime/debug"
	"strings"
)

// corePaths are the directories whose uncommitted changes make a figure
// belong to no commit.
var corePaths = []string{"queue", "notify", "migrations"}

// Commit names the pgwake code being measured: the git commit (12 hex
// digits), with "+dirty" when queue/, notify/ or migrations/ have
// uncommitted changes. It asks git in dir (the repository or a directory
// inside it) first, then the binary's build information; "unknown" if
// neither knows.
func Commit(dir string) string {
	if out, err := exec.Command("git", "-C", dir, "rev-parse", "--short=12", "HEAD").Output(); err == nil {
		c := strings.TrimSpace(string(out))
		top, err := exec.Command("git", "-C", dir, "rev-parse", "--show-toplevel").Output()
		if err == nil {
			args := append([]string{"-C", strings.TrimSpace(string(top)), "status", "--porcelain", "--"}, corePaths...)
			if st, err := exec.Command("git", args...).Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
				c += "+dirty"
			}
		}
		return c
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		var rev, mod string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				mod = s.Value
			}
		}
		if len(rev) >= 12 {
			if mod == "true" {
				return rev[:12] + "+dirty"
			}
			return rev[:12]
		}
	}
	return "unknown"
}
