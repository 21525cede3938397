package agentapi

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/yamux"
)

// Identity is who an agent says it is on the channel: its sandbox id and key.
type Identity func() (id string, key []byte)

// Uplink is the agent's end of the channel: it dials the daemon's socket,
// authenticates both ways, serves an HTTP handler over the multiplexed
// session, and redials with a short backoff when the session drops (a
// daemon restart). Close ends the session and stops dialing: once it
// returns the agent holds no connection to the host (gVisor cannot
// checkpoint a sandbox with a host socket open).
type Uplink struct {
	path    string
	ident   Identity
	handler http.Handler
	log     *slog.Logger

	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}
}

// Redial backoff bounds: the first redial is immediate, later ones back off.
const (
	redialMin = time.Millisecond
	redialMax = 200 * time.Millisecond
)

// DialUplink starts serving h to the daemon listening at path.
func DialUplink(path string, ident Identity, h http.Handler, log *slog.Logger) *Uplink {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	u := &Uplink{path: path, ident: ident, handler: h, log: log, ctx: ctx, stop: cancel, done: make(chan struct{})}
	go u.loop()
	return u
}

func (u *Uplink) loop() {
	defer close(u.done)
	backoff := time.Duration(0)
	var d net.Dialer
	lastErr := ""
	for {
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
		began := time.Now()
		err := u.once(&d)
		if u.ctx.Err() != nil {
			return
		}
		if err == nil && time.Since(began) > time.Second {
			backoff = 0 // served a real session; redial at once
			continue
		}
		// Short sessions back off too: something keeps replacing or refusing them.
		if err != nil {
			if msg := err.Error(); msg != lastErr { // one line per distinct failure
				u.log.Warn("agent channel", "err", err)
				lastErr = msg
			}
		}
		backoff = min(max(backoff*2, redialMin), redialMax)
	}
}

// once dials, authenticates and serves one session until it ends.
func (u *Uplink) once(d *net.Dialer) error {
	conn, err := d.DialContext(u.ctx, "unix", u.path)
	if err != nil {
		return err
	}
	// Closing stops everything below promptly, the handshake included.
	unwatch := context.AfterFunc(u.ctx, func() { conn.Close() })
	defer unwatch()
	id, key := u.ident()
	if err := AgentHandshake(conn, id, key); err != nil {
		conn.Close()
		return err
	}
	sess, err := yamux.Server(coalesce(conn), sessionConfig(u.log))
	if err != nil {
		conn.Close()
		return err
	}
	u.log.Info("agent channel connected", "socket", u.path)
	srv := &http.Server{Handler: u.handler, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(u.log.Handler(), slog.LevelWarn)}
	_ = srv.Serve(bulkListener{sess}) // returns when the session ends (daemon restart, quiesce)
	_ = srv.Close()
	sess.Close()
	return nil
}

// Close stops dialing and closes the session, waiting until no connection
// to the host remains.
func (u *Uplink) Close() {
	u.stop()
	<-u.done
}

// ServeConn serves h over an authenticated connection until the session
// ends (what an Uplink does with each session it dials).
func ServeConn(conn net.Conn, h http.Handler) error {
	sess, err := yamux.Server(coalesce(conn), sessionConfig(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		conn.Close()
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	_ = srv.Serve(bulkListener{sess})
	_ = srv.Close()
	return sess.Close()
}
