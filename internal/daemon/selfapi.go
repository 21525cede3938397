package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/sandbox"
)

// The in-sandbox API, the daemon's side (docs/STATE.md "Inside the
// sandbox"): every sandbox's channel hands its authenticated caller
// connections (agentapi.KindCaller) to one HTTP server here, which serves
// each request as that sandbox — auth.Principal{Owner, Sandbox} of the
// channel's sandbox, never anything the request says — after rewriting
// /v1/sandboxes/self to the sandbox's id, through the REST handler's
// SelfHandler (internal/server checks the route allowlist). Everything a
// sandbox sends is hostile: at most agentapi.MaxCallers connections per
// sandbox (the channel's bound, so at most that many requests at once),
// head and body each at most agentapi.MaxCallerRequest bytes, read and
// write timeouts, and a per-sandbox request rate. A sandbox that is not
// running (pausing, paused, stopped, deleted) gets no answer but a refusal.

// SelfHandler serves a request from inside a sandbox as principal p
// (internal/server's Server.ServeSelf).
type SelfHandler interface {
	ServeSelf(w http.ResponseWriter, r *http.Request, p Principal)
}

// Bounds of the in-sandbox API per sandbox: selfRate requests per second
// with bursts of selfBurst, and the server's timeouts.
const (
	selfRate         = 100
	selfBurst        = 200
	selfHeadTimeout  = 5 * time.Second
	selfReadTimeout  = 30 * time.Second
	selfWriteTimeout = 2 * time.Minute
	selfIdleTimeout  = 30 * time.Second
)

// SelfAPI serves the in-sandbox API's requests. Its lock mu (the rate
// buckets) is a leaf.
type SelfAPI struct {
	d       *Daemon
	handler atomic.Pointer[SelfHandler]
	srv     *http.Server
	ln      *selfListener
	serving sync.Once // the server starts with the first caller connection

	mu      sync.Mutex
	buckets map[string]*selfBucket
}

type selfBucket struct {
	tokens float64
	last   time.Time
}

func newSelfAPI(d *Daemon) *SelfAPI {
	s := &SelfAPI{d: d, ln: newSelfListener(), buckets: map[string]*selfBucket{}}
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.serveHTTP),
		ReadHeaderTimeout: selfHeadTimeout,
		ReadTimeout:       selfReadTimeout,
		WriteTimeout:      selfWriteTimeout,
		IdleTimeout:       selfIdleTimeout,
		MaxHeaderBytes:    agentapi.MaxCallerRequest,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelDebug), // a sandbox's garbage is its own
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if sc, ok := c.(*selfConn); ok {
				return context.WithValue(ctx, selfConnKey{}, sc.id)
			}
			return ctx
		},
	}
	return s
}

// SelfAPI is the in-sandbox API's server: the composition root gives it
// the REST handler with SetHandler.
func (d *Daemon) SelfAPI() *SelfAPI { return d.self }

// SetHandler sets who serves the requests (until set, every one is refused).
func (s *SelfAPI) SetHandler(h SelfHandler) { s.handler.Store(&h) }

// accept takes a sandbox's authenticated caller connection; it never blocks
// (the channel's handshake slot is still held).
func (s *SelfAPI) accept(id string, conn net.Conn) {
	s.serving.Do(func() { go func() { _ = s.srv.Serve(s.ln) }() })
	if !s.ln.push(&selfConn{Conn: conn, id: id}) {
		conn.Close()
	}
}

func (s *SelfAPI) close() {
	s.ln.Close()
	_ = s.srv.Close()
}

type selfConnKey struct{}

// selfConn is a caller connection with the sandbox its channel belongs to.
type selfConn struct {
	net.Conn
	id string
}

// allow spends one of sandbox id's request tokens.
func (s *SelfAPI) allow(id string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.buckets[id]
	if !ok {
		if len(s.buckets) > 4096 { // forget sandboxes quiet for a while
			for k, v := range s.buckets {
				if now.Sub(v.last) > time.Minute {
					delete(s.buckets, k)
				}
			}
		}
		b = &selfBucket{tokens: selfBurst, last: now}
		s.buckets[id] = b
	}
	b.tokens = min(selfBurst, b.tokens+now.Sub(b.last).Seconds()*selfRate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (s *SelfAPI) serveHTTP(w http.ResponseWriter, r *http.Request) {
	id, _ := r.Context().Value(selfConnKey{}).(string)
	if err := s.serve(w, r, id); err != nil {
		httpx.WriteError(w, err)
	}
}

func (s *SelfAPI) serve(w http.ResponseWriter, r *http.Request, id string) error {
	if id == "" {
		return errs.E(errs.Unauthenticated, "in-sandbox API: not a caller connection")
	}
	if !s.allow(id, time.Now()) {
		return errs.E(errs.ResourceExhausted, "in-sandbox API: more than %d requests per second from this sandbox", selfRate)
	}
	if r.ContentLength > agentapi.MaxCallerRequest {
		return errs.Field("body", "exceeds %d bytes", agentapi.MaxCallerRequest)
	}
	r.Body = http.MaxBytesReader(w, r.Body, agentapi.MaxCallerRequest)
	hp := s.handler.Load()
	if hp == nil {
		return errs.E(errs.Unavailable, "in-sandbox API: not served by this daemon")
	}
	sb, err := s.d.store.GetSandbox(r.Context(), id)
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			return errs.E(errs.FailedPrecondition, "in-sandbox API: sandbox %s is deleted", id)
		}
		return err
	}
	if sb.State != sandbox.Running {
		return errs.E(errs.FailedPrecondition, "in-sandbox API: sandbox %s is %s, not running", id, sb.State)
	}
	p, err := selfPath(r.URL.Path, id)
	if err != nil {
		return err
	}
	r.URL.Path, r.URL.RawPath = p, ""
	r.RequestURI = r.URL.RequestURI()
	// The principal is the channel's sandbox; nothing in the request
	// speaks for anyone.
	for _, h := range []string{"Authorization", "X-API-Key", "Cookie", "X-Berth-Csrf"} {
		r.Header.Del(h)
	}
	(*hp).ServeSelf(w, r, Principal{Owner: sb.Owner, Sandbox: id})
	return nil
}

// selfPath rewrites /v1/sandboxes/self[/...] to /v1/sandboxes/<id>[/...]
// (any other path is left to the allowlist, which refuses it); a path that is not clean (dot segments, empty segments, escapes that the
// mux would decode differently) is refused, not normalised.
func selfPath(p, id string) (string, error) {
	if !strings.HasPrefix(p, "/") || strings.Contains(p, "//") || strings.ContainsAny(p, "%\\\x00") {
		return "", errs.Field("path", "must be a clean absolute path, got %q", p)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return "", errs.Field("path", "must be a clean absolute path, got %q", p)
		}
	}
	const self = "/v1/sandboxes/self"
	if p == self || strings.HasPrefix(p, self+"/") {
		return "/v1/sandboxes/" + id + p[len(self):], nil
	}
	return p, nil
}

// selfListener is the server's listener, fed by every channel's callers.
type selfListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newSelfListener() *selfListener {
	return &selfListener{ch: make(chan net.Conn, 256), done: make(chan struct{})}
}

// push hands a connection to the server without blocking; false when the
// server is closed or behind (the caller is closed: it redials).
func (l *selfListener) push(c net.Conn) bool {
	select {
	case <-l.done:
		return false
	case l.ch <- c:
		return true
	default:
		return false
	}
}

func (l *selfListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *selfListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		for {
			select {
			case c := <-l.ch:
				c.Close()
			default:
				return
			}
		}
	})
	return nil
}

func (l *selfListener) Addr() net.Addr { return &net.UnixAddr{Name: "in-sandbox-api", Net: "unix"} }
