package exechandler

import "syscall"

// handlerSysProcAttr puts a handler command in its own process group (so a
// timeout can kill it with everything it started, and a terminal's Ctrl-C
// reaches only pgwake) and, on Linux, kills it if pgwake dies abruptly.
func handlerSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
