// Package netloop is the loops' system-level I/O on Linux, apart from what
// the loops do with it (proxy's stream and request loops): an epoll set
// with an eventfd to wake it, a table of sockets by descriptor, raw
// non-blocking reads and writes (Read, Write) and the same as a net.Conn's
// (RawSock), a socket taken out of Go's netpoller and given back
// (Dup, FileConn), an io_uring used as a batch of system calls (Ring), and
// a peek at a client that may have hung up (PeerClosed). Elsewhere only
// what the other paths need of it builds: a RawSock that is never set, a
// PeerClosed that never tells.
package netloop
