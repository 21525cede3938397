package agentapi

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// The in-sandbox API (docs/STATE.md "Inside the sandbox") rides on the same
// channel socket as the uplink, in the other direction: on a *caller*
// connection the agent is the HTTP client and the daemon the server. The
// daemon acts on such a request as the sandbox itself; which sandbox is the
// channel's, never what the request says.

// Kind tells the two kinds of channel connection apart.
type Kind uint8

const (
	// KindAgent is an uplink: the daemon is the client, the agent serves the agent API.
	KindAgent Kind = iota + 1
	// KindCaller is a caller: the agent is the client, the daemon serves the in-sandbox API.
	KindCaller
)

func (k Kind) String() string {
	if k == KindCaller {
		return "caller"
	}
	return "agent"
}

var callerMagic = [8]byte{'b', 'e', 'r', 't', 'h', 'c', 'l', '1'}

// labels are the hello magic and the two proof labels of a kind.
func (k Kind) labels() (mg [8]byte, daemonLabel, dialerLabel string) {
	if k == KindCaller {
		return callerMagic, "caller-daemon", "caller"
	}
	return magic, "daemon", "agent"
}

// CallerHandshake is the dialing side of a caller connection.
func CallerHandshake(conn net.Conn, id string, key []byte) error {
	return dialHandshake(conn, KindCaller, id, key)
}

// Bounds of the in-sandbox API, enforced by the daemon (and by the agent
// where it forwards): a sandbox gets at most MaxCallers caller connections
// (each carries one request at a time), a request's head and body are each
// at most MaxCallerRequest bytes.
const (
	MaxCallers       = 8
	MaxCallerRequest = 1 << 20
)

// callerIdle is how long the agent keeps an idle caller connection: short,
// well under the daemon's idle timeout, so the daemon never closes one
// under a request the agent is about to send.
const callerIdle = 5 * time.Second

// Caller is the agent's client of the in-sandbox API: an HTTP transport
// whose connections are caller connections to the channel socket, at most
// MaxCallers, idle ones kept briefly. Quiesce closes every one of them
// (requests in flight fail, new ones wait) and Reopen lets requests dial
// again: gVisor cannot checkpoint a sandbox with a host socket open.
type Caller struct {
	path  string
	ident Identity
	tr    *http.Transport

	mu       sync.Mutex
	quiesced bool
	reopened chan struct{}           // closed at the next Reopen (replaced by Quiesce)
	conns    map[net.Conn]struct{}   // every live caller connection
	inflight map[*callerReq]struct{} // requests between dial and end of body
}

type callerReq struct{ cancel context.CancelFunc }

// NewCaller builds the client; it dials nothing until a request.
func NewCaller(path string, ident Identity) *Caller {
	c := &Caller{path: path, ident: ident, reopened: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, inflight: map[*callerReq]struct{}{}}
	close(c.reopened)
	c.tr = &http.Transport{
		DialContext:           c.dial,
		MaxConnsPerHost:       MaxCallers,
		MaxIdleConnsPerHost:   MaxCallers,
		IdleConnTimeout:       callerIdle,
		ResponseHeaderTimeout: 2 * time.Minute,
		DisableCompression:    true,
	}
	return c
}

// dial dials and authenticates one caller connection, retrying a refused
// handshake briefly: the daemon serves few handshakes of one sandbox at
// once (its spares redialing count too) and closes the rest.
func (c *Caller) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	backoff := 2 * time.Millisecond
	for attempt := 0; ; attempt++ {
		conn, err := c.dialOnce(ctx)
		if err == nil || errs.Is(err, errs.FailedPrecondition) || ctx.Err() != nil || attempt >= 12 {
			return conn, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		backoff = min(backoff*2, 200*time.Millisecond)
	}
}

func (c *Caller) dialOnce(ctx context.Context) (net.Conn, error) {
	c.mu.Lock()
	q := c.quiesced
	c.mu.Unlock()
	if q {
		return nil, errs.E(errs.FailedPrecondition, "in-sandbox API: the agent is quiesced")
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.path)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "in-sandbox API: dial the daemon")
	}
	unwatch := context.AfterFunc(ctx, func() { conn.Close() })
	id, key := c.ident()
	err = CallerHandshake(conn, id, key)
	if !unwatch() || err != nil {
		conn.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, errs.Reclassify(errs.Unavailable, err, "in-sandbox API: handshake")
	}
	tc := &trackedConn{Conn: conn, c: c}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.quiesced {
		conn.Close()
		return nil, errs.E(errs.FailedPrecondition, "in-sandbox API: the agent is quiesced")
	}
	c.conns[tc] = struct{}{}
	return tc, nil
}

// trackedConn takes itself off the Caller's books when closed.
type trackedConn struct {
	net.Conn
	c    *Caller
	once sync.Once
}

func (t *trackedConn) Close() error {
	err := t.Conn.Close()
	t.once.Do(func() {
		t.c.mu.Lock()
		delete(t.c.conns, t)
		t.c.mu.Unlock()
	})
	return err
}

// reopenWait bounds how long a request waits for a quiesced agent to be
// reopened (a memory checkpoint freezes the waiter with it, so after a
// restore it carries on; a quiesce that never ends fails it).
const reopenWait = 2 * time.Minute

// RoundTrip sends one request to the daemon, waiting while the agent is
// quiesced. A request cut by a quiesce before its answer fails (Unavailable):
// whether the daemon acted on it is unknown, so it is not repeated.
func (c *Caller) RoundTrip(req *http.Request) (*http.Response, error) {
	for {
		c.mu.Lock()
		q, wait := c.quiesced, c.reopened
		c.mu.Unlock()
		if !q {
			break
		}
		t := time.NewTimer(reopenWait)
		select {
		case <-wait:
			t.Stop()
		case <-req.Context().Done():
			t.Stop()
			return nil, req.Context().Err()
		case <-t.C:
			return nil, errs.E(errs.Unavailable, "in-sandbox API: the agent stayed quiesced for %s", reopenWait)
		}
	}
	ctx, cancel := context.WithCancel(req.Context())
	r := &callerReq{cancel: cancel}
	c.mu.Lock()
	if c.quiesced { // quiesced meanwhile: wait again
		c.mu.Unlock()
		cancel()
		return c.RoundTrip(req)
	}
	c.inflight[r] = struct{}{}
	c.mu.Unlock()
	done := func() {
		c.mu.Lock()
		delete(c.inflight, r)
		c.mu.Unlock()
		cancel()
	}
	out := req.Clone(ctx)
	out.URL.Scheme, out.URL.Host, out.Host = "http", "berth", "berth"
	resp, err := c.tr.RoundTrip(out)
	if err != nil {
		done()
		if errs.KindOf(err) == errs.Internal { // the transport's own: the connection failed
			err = errs.Reclassify(errs.Unavailable, err, "in-sandbox API")
		}
		return nil, err
	}
	resp.Body = &doneBody{ReadCloser: resp.Body, done: done}
	return resp, nil
}

// Quiesce closes every caller connection and cancels requests in flight;
// requests arriving afterwards wait for Reopen. When it returns the agent
// holds no caller connection to the host.
func (c *Caller) Quiesce() {
	c.mu.Lock()
	if !c.quiesced {
		c.quiesced = true
		c.reopened = make(chan struct{})
	}
	var reqs []*callerReq
	for r := range c.inflight {
		reqs = append(reqs, r)
	}
	var conns []net.Conn
	for conn := range c.conns {
		conns = append(conns, conn)
	}
	c.mu.Unlock()
	for _, r := range reqs {
		r.cancel()
	}
	c.tr.CloseIdleConnections()
	for _, conn := range conns {
		conn.Close()
	}
}

// Reopen lets requests dial again (after a restore, or a quiesce that led
// to no checkpoint).
func (c *Caller) Reopen() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.quiesced {
		c.quiesced = false
		close(c.reopened)
	}
}

// Conns is how many caller connections are open (tests).
func (c *Caller) Conns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// doneBody runs done once when the body is closed or read to its end.
type doneBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *doneBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.once.Do(b.done)
	}
	return n, err
}

func (b *doneBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}
