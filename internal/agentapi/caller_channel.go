package agentapi

import (
	"net"
	"sync"
)

// The daemon's side of caller connections on a Channel: ServeCallers says
// who serves them; a caller must authenticate as the channel's own sandbox
// (a fork child's channel also accepts its parent's identity for the
// uplink until rekeyed, never for a caller), and at most MaxCallers are
// open at once.

// ServeCallers makes the channel accept caller connections and hand each,
// authenticated, to serve (which owns it from then on). nil refuses them.
func (c *Channel) ServeCallers(serve func(net.Conn)) {
	c.mu.Lock()
	c.serve = serve
	c.mu.Unlock()
}

// acceptKey is the handshake's key lookup for both kinds; a caller's
// takes one of the MaxCallers slots (slot: the handshake must give it back
// if it fails, startCaller keeps it for the connection).
func (c *Channel) acceptKey(k Kind, id string) (key []byte, ok, slot bool) {
	if k == KindAgent {
		key, ok = c.keyFor(id)
		return key, ok, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if id != c.id || c.serve == nil || c.closed || c.callerSlots >= MaxCallers {
		return nil, false, false
	}
	key, ok = c.keys[id]
	if ok {
		c.callerSlots++
	}
	return key, ok, ok
}

// callerConn is one authenticated caller connection, on the books (and
// counted by WaitDisconnected) until closed.
type callerConn struct {
	net.Conn
	ch   *Channel
	once sync.Once
}

func (k *callerConn) Close() error {
	err := k.Conn.Close()
	k.once.Do(func() {
		k.ch.mu.Lock()
		delete(k.ch.callers, k)
		k.ch.callerSlots--
		k.ch.notify()
		k.ch.mu.Unlock()
	})
	return err
}

func (c *Channel) startCaller(conn net.Conn) {
	c.mu.Lock()
	serve := c.serve
	if c.closed || serve == nil {
		c.callerSlots--
		c.mu.Unlock()
		conn.Close()
		return
	}
	k := &callerConn{Conn: conn, ch: c}
	c.callers[k] = struct{}{}
	c.notify()
	c.mu.Unlock()
	serve(k)
}

// Callers is how many caller connections are open.
func (c *Channel) Callers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.callers)
}
