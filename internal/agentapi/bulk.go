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

// uploadChunk is how much of an upload body the daemon writes to the
// agent's socket at once. net/http's own copy moves 32 KiB per write, and
// the agent's reads follow the writes: under gVisor each read is a host
// round trip through the sentry, ~2000 of them for 64 MiB.
const uploadChunk = 1 << 20

var uploadBufs = sync.Pool{New: func() any { b := make([]byte, uploadChunk); return &b }}

// bulkBody is an upload body whose WriteTo (which net/http's request
// writer uses: io.Copy prefers it) reads and writes up to uploadChunk at a
// time; each write becomes one chunk of the chunked request body.
type bulkBody struct{ r io.Reader }

func (b bulkBody) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b bulkBody) WriteTo(w io.Writer) (int64, error) {
	bp := uploadBufs.Get().(*[]byte)
	defer uploadBufs.Put(bp)
	var total int64
	for {
		n, rerr := io.ReadFull(b.r, *bp)
		if n > 0 {
			m, err := w.Write((*bp)[:n])
			total += int64(m)
			if err != nil {
				return total, err
			}
		}
		switch {
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			return total, nil
		case rerr != nil:
			return total, rerr
		}
	}
}
