package queue

import (
	"net"
	"syscall"
)

// cork makes the kernel hold what is written to c's TCP socket until
// uncork is called (TCP_CORK), so that a write returns once its bytes are
// in the socket's buffer, without taking the time to push them through the
// loopback and wake the server's process (medians of 45-107 µs a write on
// an idle 2-core machine, against 9.5-20 µs corked: BenchmarkCorkedWrite). Bytes held that way are not
// lost when the process dies: closing the socket, which the kernel does
// for a dead process, sends them with the FIN, and the server runs the
// statement they carry (TestCorkedWriteSurvivesItsProcess). A connection that
// is not TCP (a Unix socket) is left as it is: uncork does nothing.
func cork(c net.Conn) (uncork func()) {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok { // *tls.Conn
		c = tc.NetConn()
	}
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		return func() {}
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return func() {}
	}
	set := func(v int) error {
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, v)
		}); err != nil {
			return err
		}
		return serr
	}
	if set(1) != nil {
		return func() {}
	}
	return func() { _ = set(0) }
}
