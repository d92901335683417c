//go:build !linux

package queue

import "net"

// cork does nothing here (see cork_linux.go): a write pushes its bytes.
func cork(net.Conn) (uncork func()) { return func() {} }
