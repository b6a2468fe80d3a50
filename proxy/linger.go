package proxy

import (
	"net"
	"time"
)

// A connection closed while its client is still sending — a body over
// the limit, headers too large, a request fasthttp could not parse — has
// bytes unread in its socket, and closing such a socket sends a reset
// instead of a FIN. The reset can reach the client before it has read the
// answer already sent, and its kernel then drops that answer: the client
// sees "connection reset by peer" rather than the router's 413. So such a
// connection is closed as nginx's lingering_close and Go's net/http close
// it: the write side first, so the answer and a FIN go out, then the
// client's bytes are read and dropped until it closes its side (having
// read the answer), for at most lingerTime and lingerBytes.
const (
	lingerTime  = 2 * time.Second
	lingerBytes = 8 << 20
)

// closeWriter is a connection that can shut down its write side alone:
// *net.TCPConn and netloop.FileConn.
type closeWriter interface{ CloseWrite() error }

// linger sends c's FIN and drops what its client still sends, through
// read (c's own reads), until the client closes, lingerTime passes or
// lingerBytes have been dropped. It leaves c open: the caller closes it.
func linger(c net.Conn, read func([]byte) (int, error)) {
	cw, ok := c.(closeWriter)
	if !ok || cw.CloseWrite() != nil {
		return
	}
	// A deadline is the netpoller's wall clock: nothing to inject.
	if c.SetReadDeadline(time.Now().Add(lingerTime)) != nil {
		return
	}
	b := prefetchBufs.Get().(*[]byte)
	defer prefetchBufs.Put(b)
	for dropped := 0; dropped < lingerBytes; {
		n, err := read(*b)
		dropped += n
		if err != nil {
			return
		}
	}
}
