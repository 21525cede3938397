package agentapi

import (
	"io"
	"net"
	"sync"
)

// copyChunk is how much a response body copy moves per write: the http
// server copies a file 32 KiB at a time, and through gVisor's sentry each
// write is a host syscall.
const copyChunk = 256 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyChunk); return &b }}

// bulkListener hands the agent's http.Server connections whose ReadFrom copies
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
