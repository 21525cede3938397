package agentapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/hashicorp/yamux"
)

// Channel is the host's end of one sandbox's agent channel. The daemon
// listens on a unix socket in a directory only it can write (mounted
// read-only into the sandbox); the agent dials it, both prove they hold the
// sandbox's key, and the agent serves its HTTP API over a multiplexed
// session on that one connection. The channel keeps the latest
// authenticated session; requests open streams on it.
type Channel struct {
	path string
	ln   *net.UnixListener
	sock os.FileInfo // the socket file this listener created
	log  *slog.Logger

	mu      sync.Mutex
	keys    map[string][]byte // agent ids accepted here → their keys
	sess    *yamux.Session
	changed chan struct{} // closed (and replaced) whenever sess changes
	closed  bool
	pending map[net.Conn]struct{} // connections still in their handshake

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

// dialWait is how long a request waits for an agent session to appear
// (an agent redials within a fraction of a second after a daemon restart).
const dialWait = 3 * time.Second

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
	c := &Channel{path: path, ln: ln, sock: fi, log: log.With("socket", path),
		keys: map[string][]byte{id: key}, changed: make(chan struct{}), pending: map[net.Conn]struct{}{},
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
// the daemon rekeys it over the authenticated session.
func (c *Channel) Allow(id string, key []byte) (forget func()) {
	c.mu.Lock()
	c.keys[id] = key
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.keys, id)
		c.mu.Unlock()
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

const streamWindow = 1 << 20

// logWriter turns yamux's log lines into warnings on log.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Warn("agent channel session", "msg", strings.TrimSpace(string(p)))
	return len(p), nil
}

func sessionConfig(log *slog.Logger) *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.KeepAliveInterval = 10 * time.Second
	cfg.StreamOpenTimeout = 10 * time.Second
	cfg.StreamCloseTimeout = 30 * time.Second
	cfg.LogOutput = logWriter{log}
	// A window per stream is what one stream can make the peer buffer: 1 MiB
	// keeps bulk file copies from stalling on window updates and bounds what
	// an agent can park on the host per open request.
	cfg.MaxStreamWindowSize = streamWindow
	return cfg
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
	id, err := DaemonHandshake(conn, c.keyFor)
	c.mu.Lock()
	delete(c.pending, conn)
	c.mu.Unlock()
	if err != nil {
		c.logRefusal(err)
		conn.Close()
		return
	}
	sess, err := yamux.Client(coalesce(conn), sessionConfig(c.log))
	if err != nil {
		conn.Close()
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		sess.Close()
		return
	}
	old := c.sess
	c.sess = sess
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	if old != nil {
		c.log.Info("agent channel: a newer session replaces the current one", "agent", id)
		old.Close()
	}
	c.client.CloseIdle()
	c.log.Debug("agent channel authenticated", "agent", id)
	// The daemon never accepts streams: refuse what the agent opens, so
	// nothing buffers on the host for them.
	for {
		s, err := sess.Accept()
		if err != nil {
			break
		}
		s.Close()
	}
	c.mu.Lock()
	if c.sess == sess {
		c.sess = nil
		close(c.changed)
		c.changed = make(chan struct{})
	}
	c.mu.Unlock()
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

// current returns the live session and a channel closed when it changes.
func (c *Channel) current() (*yamux.Session, <-chan struct{}, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sess
	if s != nil && s.IsClosed() {
		s = nil
	}
	return s, c.changed, c.closed
}

// DialContext opens a stream on the current session, waiting up to
// dialWait (or ctx) for an agent to connect.
func (c *Channel) DialContext(ctx context.Context) (net.Conn, error) {
	var timer <-chan time.Time
	for {
		s, changed, closed := c.current()
		if closed {
			return nil, errs.E(errs.Unavailable, "agent channel closed")
		}
		if s != nil {
			conn, err := s.Open()
			if err == nil {
				return conn, nil
			}
			if !s.IsClosed() {
				return nil, errs.Wrap(errs.Unavailable, err, "agent channel")
			}
			continue // it just died: wait for the next one
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

// WaitDisconnected waits until no agent session is live (the agent closes
// its session when told to quiesce before a checkpoint).
func (c *Channel) WaitDisconnected(ctx context.Context, limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	for {
		s, changed, _ := c.current()
		if s == nil {
			return nil
		}
		select {
		case <-s.CloseChan():
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return errs.E(errs.Unavailable, "agent still connected after %s", limit)
		}
	}
}

// Close stops listening (removing the socket) and ends the session.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s := c.sess
	c.sess = nil
	close(c.changed)
	c.changed = make(chan struct{})
	for conn := range c.pending {
		conn.Close()
	}
	c.mu.Unlock()
	err := c.ln.Close()
	if fi, lerr := os.Lstat(c.path); lerr == nil && os.SameFile(fi, c.sock) {
		_ = os.Remove(c.path)
	}
	if s != nil {
		s.Close()
	}
	c.client.CloseIdle()
	c.wg.Wait()
	return err
}

// UnreachableClient is a client whose every call fails with err's reason
// (a sandbox without a channel on this host).
func UnreachableClient(err error) *Client {
	return newClient("unreachable", func(context.Context) (net.Conn, error) {
		return nil, errs.Wrap(errs.Unavailable, err, "agent channel")
	})
}

// Quiesce asks the agent to close its session and stop dialing, and waits
// (up to limit) until the session is gone: the agent's acknowledgement.
// The agent closes right after answering, so the request may see the
// session end instead of the answer; that is success too once the session
// is gone.
func (c *Channel) Quiesce(ctx context.Context, limit time.Duration) error {
	qctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	err := c.client.Quiesce(qctx)
	if err != nil && !errors.Is(err, yamux.ErrSessionShutdown) && !errors.Is(err, io.EOF) &&
		!errors.Is(err, yamux.ErrStreamClosed) && !errors.Is(err, yamux.ErrConnectionReset) {
		return err
	}
	return c.WaitDisconnected(ctx, limit)
}
