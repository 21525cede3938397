package agentapi

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
)

// yamux writes every frame as two writes: a 12-byte header, then the
// body. Over a unix socket (and through gVisor's sentry, where each write
// is a host syscall) that doubles the cost of every small message.
// coalescingConn holds a data frame's header and sends it with its body in
// one writev. Only yamux's send loop writes, so no lock is needed; a
// header with no body (window update, ping, go away, empty data) goes out
// at once.
type coalescingConn struct {
	net.Conn
	hdr  [yamuxHeaderSize]byte
	held bool
}

const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
)

func coalesce(c net.Conn) net.Conn { return &coalescingConn{Conn: c} }

func (c *coalescingConn) Write(p []byte) (int, error) {
	if c.held {
		c.held = false
		bufs := net.Buffers{c.hdr[:], p}
		n, err := bufs.WriteTo(c.Conn)
		n -= yamuxHeaderSize
		if n < 0 {
			n = 0
		}
		return int(n), err
	}
	if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:12]) > 0 {
		copy(c.hdr[:], p)
		c.held = true
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// copyChunk is how much a response body copy moves per frame: the http
// server copies a file 32 KiB at a time, and each write is one frame
// through the session's send loop.
const copyChunk = 256 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyChunk); return &b }}

// bulkListener hands the agent's http.Server streams whose ReadFrom copies
// in copyChunk pieces (net/http uses it for bodies of known length).
type bulkListener struct{ net.Listener }

func (l bulkListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return bulkConn{c}, nil
}

type bulkConn struct{ net.Conn }

type writerOnly struct{ io.Writer }

func (c bulkConn) ReadFrom(r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(writerOnly{c.Conn}, r, *bp)
}
