package agentapi

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Identity is who an agent says it is on the channel: its sandbox id and key.
type Identity func() (id string, key []byte)

// Uplink is the agent's end of the channel: it keeps Spares authenticated
// connections dialed to the daemon's socket, serves an HTTP handler on
// every connection, and dials a replacement whenever a spare carries its
// first request or closes (a daemon restart: it redials with a short
// backoff). Close closes every connection and stops dialing: once it
// returns the agent holds no connection to the host (gVisor cannot
// checkpoint a sandbox with a host socket open).
type Uplink struct {
	path  string
	ident Identity
	log   *slog.Logger
	srv   *http.Server
	ln    *connListener

	ctx    context.Context
	stop   context.CancelFunc
	done   chan struct{} // the dial loop ended
	served chan struct{} // srv.Serve returned

	mu           sync.Mutex
	conns        map[*upConn]struct{}
	idle         int           // spares not yet used
	wake         chan struct{} // (cap 1) a spare was used or closed
	used         bool          // a connection carried a request since the last failure
	unusedClosed int           // spares that closed before carrying a request
}

// Spares is how many idle authenticated connections an agent keeps dialed.
const Spares = 2

// Redial backoff bounds: the first redial is immediate, later ones back off.
const (
	redialMin = time.Millisecond
	redialMax = 200 * time.Millisecond
)

// channelServer serves h on the channel's connections. It sets no read
// timeout: its only peer is the daemon, authenticated on every connection,
// and a spare waits for its first request for as long as the daemon has
// none to send. With net/http's default (ReadHeaderTimeout, also the idle
// timeout) every spare and kept-alive connection was closed after 10 s and
// redialled: with the reaper asking every 10 s, 200 handshakes a second at
// 1,000 idle sandboxes, a fifth of the daemon's CPU. Idle connections now
// end when the daemon's transport drops them (newClient: 90 s).
func channelServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{Handler: h, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)} //nolint:gosec // see above
}

// DialUplink starts serving h to the daemon listening at path.
func DialUplink(path string, ident Identity, h http.Handler, log *slog.Logger) *Uplink {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	u := &Uplink{path: path, ident: ident, log: log, ctx: ctx, stop: cancel,
		done: make(chan struct{}), served: make(chan struct{}),
		ln: newConnListener(), conns: map[*upConn]struct{}{}, wake: make(chan struct{}, 1)}
	u.srv = channelServer(h, log)
	go func() {
		defer close(u.served)
		_ = u.srv.Serve(bulkListener{u.ln})
	}()
	go u.loop()
	return u
}

func (u *Uplink) poke() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// need reports whether another spare should be dialed.
func (u *Uplink) need() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.idle < Spares && len(u.conns) < MaxConns
}

func (u *Uplink) loop() {
	defer close(u.done)
	backoff := time.Duration(0)
	var d net.Dialer
	lastErr := ""
	connected := false
	for {
		if !u.need() {
			select {
			case <-u.ctx.Done():
				return
			case <-u.wake:
				continue
			}
		}
		u.mu.Lock()
		if u.used {
			backoff, u.used = 0, false // the daemon takes what we dial: redial at once
		}
		if u.unusedClosed > 0 {
			// Spares that close unused back off too: something keeps refusing them.
			backoff, u.unusedClosed = min(max(backoff*2, redialMin), redialMax), 0
			connected = false
		}
		u.mu.Unlock()
		if backoff > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-u.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if u.ctx.Err() != nil {
			return
		}
		err := u.dialOne(&d)
		if u.ctx.Err() != nil {
			return
		}
		if err != nil {
			if msg := err.Error(); msg != lastErr { // one line per distinct failure
				u.log.Warn("agent channel", "err", err)
				lastErr = msg
			}
			connected = false
			backoff = min(max(backoff*2, redialMin), redialMax)
			continue
		}
		lastErr = ""
		if !connected {
			u.log.Info("agent channel connected", "socket", u.path)
			connected = true
		}
	}
}

// dialOne dials and authenticates one spare and hands it to the server.
func (u *Uplink) dialOne(d *net.Dialer) error {
	conn, err := d.DialContext(u.ctx, "unix", u.path)
	if err != nil {
		return err
	}
	// Closing stops the handshake promptly.
	unwatch := context.AfterFunc(u.ctx, func() { conn.Close() })
	id, key := u.ident()
	err = AgentHandshake(conn, id, key)
	if !unwatch() || err != nil {
		conn.Close()
		return err
	}
	c := &upConn{Conn: conn, u: u}
	u.mu.Lock()
	if u.ctx.Err() != nil {
		u.mu.Unlock()
		conn.Close()
		return nil
	}
	u.conns[c] = struct{}{}
	u.idle++
	u.mu.Unlock()
	if !u.ln.push(c) {
		c.Close()
	}
	return nil
}

// upConn is one of the agent's connections: its first read marks the
// spare used (a replacement is dialed), its close takes it off the books.
type upConn struct {
	net.Conn
	u      *Uplink
	used   atomic.Bool
	closed sync.Once
}

func (c *upConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.used.Load() && c.used.CompareAndSwap(false, true) {
		c.u.mu.Lock()
		if _, live := c.u.conns[c]; live {
			c.u.idle--
		}
		c.u.used = true
		c.u.mu.Unlock()
		c.u.poke()
	}
	return n, err
}

func (c *upConn) Close() error {
	err := c.Conn.Close()
	c.closed.Do(func() {
		c.u.mu.Lock()
		if _, live := c.u.conns[c]; live {
			delete(c.u.conns, c)
			if !c.used.Load() {
				c.u.idle--
				c.u.unusedClosed++
			}
		}
		c.u.mu.Unlock()
		c.u.poke()
	})
	return err
}

// Close stops dialing and closes every connection (hijacked and streaming
// ones included), waiting until no connection to the host remains.
func (u *Uplink) Close() {
	u.stop()
	<-u.done
	u.ln.Close()
	_ = u.srv.Close()
	<-u.served
	u.mu.Lock()
	var all []*upConn
	for c := range u.conns {
		all = append(all, c)
	}
	u.mu.Unlock()
	for _, c := range all {
		c.Close()
	}
}

// connListener is a net.Listener fed with connections the agent dialed.
type connListener struct {
	ch     chan net.Conn
	done   chan struct{}
	closed sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn, MaxConns), done: make(chan struct{})}
}

func (l *connListener) push(c net.Conn) bool {
	select {
	case <-l.done:
		return false
	default:
	}
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.closed.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.UnixAddr{Name: "agent-channel", Net: "unix"} }

// notifyConn closes done when it is closed.
type notifyConn struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

func (c *notifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// ServeConn serves h over one authenticated connection until it ends
// (what an Uplink does with each connection it dials).
func ServeConn(conn net.Conn, h http.Handler) error {
	c := &notifyConn{Conn: conn, done: make(chan struct{})}
	ln := newConnListener()
	ln.push(c)
	srv := channelServer(h, slog.New(slog.NewTextHandler(io.Discard, nil)))
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(bulkListener{ln})
	}()
	<-c.done
	ln.Close()
	_ = srv.Close()
	<-served
	return nil
}
