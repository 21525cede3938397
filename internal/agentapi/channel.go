package agentapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"golang.org/x/sys/unix"
)

// Channel is the host's end of one sandbox's agent channel. The daemon
// listens on a unix socket in a directory only it can write (mounted
// read-only into the sandbox); the agent dials it, and both prove on every
// connection that they hold the sandbox's key. The agent keeps a few
// authenticated connections idle here ("spares"); each request takes one
// (or reuses one the client's transport keeps alive) and speaks plain
// HTTP/1.1 on it: no multiplexer between the daemon and the agent.
type Channel struct {
	path string
	id   string // the sandbox this channel belongs to: the only identity a caller may have
	ln   *net.UnixListener
	sock os.FileInfo // the socket file this listener created
	log  *slog.Logger

	mu          sync.Mutex
	keys        map[string][]byte       // agent ids accepted here → their keys
	conns       map[*agentConn]struct{} // every authenticated connection, queued or in use
	spares      []*agentConn            // authenticated, not yet handed to the client (oldest first)
	changed     chan struct{}           // closed (and replaced) whenever conns or spares change
	closed      bool
	pending     map[net.Conn]struct{}    // connections still in their handshake
	callers     map[*callerConn]struct{} // authenticated caller connections (caller_channel.go)
	callerSlots int                      // callers plus caller handshakes past the key lookup (≤ MaxCallers)
	serve       func(net.Conn)           // serves a caller connection; nil: callers refused

	handshakes chan struct{} // bounds concurrent handshakes
	rate       bucket        // bounds the rate of handshakes (accept loop only)

	refusedMu     sync.Mutex
	refusedLogged time.Time // refusals are logged at most once a minute, with a count
	refused       int
	wg            sync.WaitGroup
	client        *Client
}

// maxPendingHandshakes bounds how many unauthenticated connections one
// sandbox can hold open at once (each for at most HandshakeTimeout).
const maxPendingHandshakes = 4

// MaxConns bounds the authenticated connections of one sandbox (queued
// spares and those carrying requests); the daemon closes any beyond it.
const MaxConns = 64

// A sandbox gets handshakeBurst connections at once, then handshakeRate per second.
const (
	handshakeBurst = 32
	handshakeRate  = 20
)

// bucket is a token bucket; used by one goroutine.
type bucket struct {
	tokens float64
	last   time.Time
}

func (b *bucket) allow(now time.Time) bool {
	b.tokens = min(handshakeBurst, b.tokens+now.Sub(b.last).Seconds()*handshakeRate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// dialWait is how long a request waits for an agent connection to appear
// (an agent redials within a fraction of a second after a daemon restart).
const dialWait = 3 * time.Second

// agentConn is one authenticated connection. While it waits in the spare
// queue a watcher reads it, so a connection the agent closes leaves the
// queue (the agent never speaks first on an idle connection: a byte read
// there is a protocol violation and closes it).
type agentConn struct {
	net.Conn
	ch    *Channel
	id    string // the identity it authenticated as
	once  sync.Once
	watch chan error // the watcher's verdict, nil once handed out
}

func (a *agentConn) Close() error {
	err := a.Conn.Close()
	a.once.Do(func() { a.ch.forget(a) })
	return err
}

func (a *agentConn) watchIdle() {
	var b [1]byte
	_, err := a.Conn.Read(b[:])
	if err == nil {
		err = errors.New("agent spoke first on an idle connection")
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		a.Close() // leaves the queue and the count now, not when next claimed
	}
	a.watch <- err
}

// claim stops the idle watcher; it reports whether the connection is still usable.
func (a *agentConn) claim() bool {
	_ = a.Conn.SetReadDeadline(time.Unix(1, 0))
	err := <-a.watch
	a.watch = nil
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		a.Close()
		return false
	}
	if a.Conn.SetReadDeadline(time.Time{}) != nil {
		a.Close()
		return false
	}
	return true
}

// Listen creates the channel socket at path (replacing a stale one: path's
// directory must be writable by the host only) accepting agent id with key.
func Listen(path, id string, key []byte, log *slog.Logger) (*Channel, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, errs.Wrap(errs.Internal, err, "remove stale channel socket")
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "listen on %s", path)
	}
	// Close removes the socket only while it is still this listener's: a
	// successor may already listen at the same path.
	ln.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err == nil {
		// A sandbox root mapped to an unprivileged host uid must still connect.
		err = os.Chmod(path, 0o666)
	}
	if err != nil {
		ln.Close()
		_ = os.Remove(path)
		return nil, errs.Wrap(errs.Internal, err, "chmod channel socket")
	}
	c := &Channel{path: path, id: id, ln: ln, sock: fi, log: log.With("socket", path),
		callers: map[*callerConn]struct{}{},
		keys:    map[string][]byte{id: key}, conns: map[*agentConn]struct{}{}, changed: make(chan struct{}),
		pending:    map[net.Conn]struct{}{},
		handshakes: make(chan struct{}, maxPendingHandshakes),
		rate:       bucket{tokens: handshakeBurst, last: time.Now()}}
	c.client = newClient(path, c.DialContext)
	c.wg.Add(1)
	go c.acceptLoop()
	return c, nil
}

// Client is the agent API over this channel.
func (c *Channel) Client() *Client { return c.client }

// Allow accepts another agent identity until the returned func is called:
// a fork child's restored agent still holds its parent's id and key until
// the daemon rekeys it. Forgetting the identity also closes every
// connection authenticated with it (the agent redials as itself).
func (c *Channel) Allow(id string, key []byte) (forget func()) {
	c.mu.Lock()
	c.keys[id] = key
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.keys, id)
		var drop []*agentConn
		for a := range c.conns {
			if a.id == id {
				drop = append(drop, a)
			}
		}
		c.mu.Unlock()
		c.client.CloseIdle()
		for _, a := range drop {
			a.Close()
		}
	}
}

func (c *Channel) keyFor(id string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.keys[id]
	return k, ok
}

func (c *Channel) acceptLoop() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				c.log.Warn("agent channel accept", "err", err)
			}
			return
		}
		if !c.rate.allow(time.Now()) {
			conn.Close() // a sandbox dialing in a loop costs the host nothing more
			continue
		}
		select {
		case c.handshakes <- struct{}{}:
		default:
			conn.Close() // a flood of unauthenticated connections
			continue
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer func() { <-c.handshakes }()
			c.authenticate(conn)
		}()
	}
}

// notify wakes everyone waiting on a change; c.mu held.
func (c *Channel) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Channel) authenticate(conn net.Conn) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		conn.Close()
		return
	}
	c.pending[conn] = struct{}{}
	c.mu.Unlock()
	reserved := false // a caller slot, taken by the key lookup (caller_channel.go)
	id, kind, err := DaemonAccept(conn, func(k Kind, id string) ([]byte, bool) {
		key, ok, slot := c.acceptKey(k, id)
		reserved = slot
		return key, ok
	})
	c.mu.Lock()
	delete(c.pending, conn)
	if err != nil && reserved {
		c.callerSlots--
	}
	c.mu.Unlock()
	if err != nil {
		c.logRefusal(err)
		conn.Close()
		return
	}
	if kind == KindCaller {
		c.startCaller(conn)
		return
	}
	a := &agentConn{Conn: conn, ch: c, id: id, watch: make(chan error, 1)}
	c.mu.Lock()
	_, still := c.keys[id] // not forgotten during the handshake
	if closed, full := c.closed, len(c.conns) >= MaxConns; closed || !still || full {
		c.mu.Unlock()
		conn.Close()
		if full && !closed && still {
			c.logRefusal(errs.E(errs.ResourceExhausted, "more than %d agent connections", MaxConns))
		}
		return
	}
	c.conns[a] = struct{}{}
	c.spares = append(c.spares, a)
	c.notify()
	c.mu.Unlock()
	go a.watchIdle()
	c.log.Debug("agent channel authenticated", "agent", id)
}

// forget drops a closed connection from the books.
func (c *Channel) forget(a *agentConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.conns, a)
	for i, s := range c.spares {
		if s == a {
			c.spares = append(c.spares[:i], c.spares[i+1:]...)
			break
		}
	}
	c.notify()
}

// logRefusal logs a refused handshake without letting a sandbox that
// dials in a loop flood the daemon's log.
func (c *Channel) logRefusal(err error) {
	c.refusedMu.Lock()
	c.refused++
	n := c.refused
	now := time.Now()
	if now.Sub(c.refusedLogged) < time.Minute {
		c.refusedMu.Unlock()
		return
	}
	c.refusedLogged, c.refused = now, 0
	c.refusedMu.Unlock()
	c.log.Warn("agent channel refused a connection", "err", err, "refused_since_last_log", n)
}

// take pops the oldest spare, or returns a channel closed at the next change.
func (c *Channel) take() (*agentConn, <-chan struct{}, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, true
	}
	if len(c.spares) == 0 {
		return nil, c.changed, false
	}
	a := c.spares[0]
	c.spares = c.spares[1:]
	return a, nil, false
}

// DialContext hands out an authenticated spare connection, waiting up to
// dialWait (or ctx) for the agent to provide one.
func (c *Channel) DialContext(ctx context.Context) (net.Conn, error) {
	var timer <-chan time.Time
	for {
		a, changed, closed := c.take()
		if closed {
			return nil, errs.E(errs.Unavailable, "agent channel closed")
		}
		if a != nil {
			if a.claim() {
				return a, nil
			}
			continue // it died waiting: take the next
		}
		if timer == nil {
			t := time.NewTimer(dialWait)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, errs.Wrap(errs.Unavailable, ctx.Err(), "agent not connected")
		case <-timer:
			return nil, errs.E(errs.Unavailable, "agent not connected")
		}
	}
}

// connected returns how many authenticated connections the agent still
// holds open (one it has closed may wait for its reader here: an exec
// stream's consumer), and a channel closed when the set changes.
func (c *Channel) connected() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for a := range c.conns {
		if !peerClosed(a.Conn) {
			n++
		}
	}
	for k := range c.callers {
		if !peerClosed(k.Conn) {
			n++
		}
	}
	return n, c.changed
}

// peerClosed reports whether the other end of conn has hung up, without
// reading from it.
func peerClosed(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	hung := false
	err = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			hung = fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
		}
	})
	return hung || err != nil
}

// WaitDisconnected waits until the agent holds no connection open (it
// closes all of them when told to quiesce before a checkpoint).
func (c *Channel) WaitDisconnected(ctx context.Context, limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	tick := time.NewTicker(5 * time.Millisecond) // a hang-up elsewhere changes nothing here
	defer tick.Stop()
	for {
		n, changed := c.connected()
		if n == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return errs.E(errs.Unavailable, "agent still connected after %s (%d connections)", limit, n)
		}
	}
}

// Close stops listening (removing the socket) and closes every connection.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var all []*agentConn
	for a := range c.conns {
		all = append(all, a)
	}
	c.spares = nil
	for k := range c.callers {
		k.Conn.Close() // forgotten when its server lets go of it
	}
	c.notify()
	for conn := range c.pending {
		conn.Close()
	}
	c.mu.Unlock()
	err := c.ln.Close()
	if fi, lerr := os.Lstat(c.path); lerr == nil && os.SameFile(fi, c.sock) {
		_ = os.Remove(c.path)
	}
	for _, a := range all {
		a.Close()
	}
	c.client.CloseIdle()
	c.wg.Wait()
	return err
}

// UnreachableClient is a client whose every call fails with err's reason
// (a sandbox without a channel on this host).
func UnreachableClient(err error) *Client {
	return newClient("unreachable", func(context.Context) (net.Conn, error) {
		return nil, errs.Reclassify(errs.Unavailable, err, "agent channel")
	})
}

// Quiesce asks the agent to close its connections and stop dialing, and
// waits (up to limit) until none is left: the agent's acknowledgement.
// The agent closes right after answering, so the request may see the
// connection end instead of the answer; that is success too once every
// connection is gone.
func (c *Channel) Quiesce(ctx context.Context, limit time.Duration) error {
	qctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	err := c.client.Quiesce(qctx)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) &&
		!errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, net.ErrClosed) {
		return err
	}
	c.client.CloseIdle()
	return c.WaitDisconnected(ctx, limit)
}
