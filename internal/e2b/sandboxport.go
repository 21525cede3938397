package e2b

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Sandbox ports other than envd, addressed the way E2B SDKs address them
// when E2B_SANDBOX_URL is set: E2b-Sandbox-Id plus E2b-Sandbox-Port (the
// code interpreter's 49999, or a server the agent started). They are
// authenticated as envd is, by the sandbox's own credentials: its envd
// access token (X-Access-Token) or its traffic access token
// (E2B-Traffic-Access-Token, handed out with the envd token on create and
// connect). The request is relayed to the port over berth's port-dial path
// (hostnet's DialPort: a TCP connection to the sandbox's address in its own
// network namespace), never through a host path, with the routing headers
// and credentials stripped.

// trafficTokenPrefix marks berth's traffic access tokens.
const trafficTokenPrefix = "btt_"

// trafficToken derives a sandbox's traffic access token from its envd
// token: a one-way function, so the traffic token (which reaches only
// ports, and may be handed to whoever should reach a server in the
// sandbox) does not reveal the envd token (which runs commands).
func trafficToken(envdToken string) string {
	if envdToken == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("berth e2b traffic access token\x00" + envdToken))
	return trafficTokenPrefix + hex.EncodeToString(sum[:24])
}

// portBackendKey carries the addressed sandbox and port to the proxy's
// dialer.
type portTargetKey struct{}

type portTarget struct {
	id, port string
	started  time.Time
}

// maxPortResponseHeader bounds the response headers a sandbox's server may
// send back; bodies are streamed, never buffered.
const maxPortResponseHeader = 64 << 10

// maxBufferedPortBody is the largest request body read before relaying;
// larger ones (and bodies of unknown length) stream through.
const maxBufferedPortBody = 1 << 20

// serveSandboxPort relays a request to port of sandbox id. keyOK says
// whether the owner's API key is a credential for it (host-routed
// requests, berth's port rule; header-routed ones need the sandbox's own
// tokens, as E2B's router does).
func (s *Server) serveSandboxPort(w http.ResponseWriter, r *http.Request, id, port string, keyOK bool) {
	ctx := r.Context()
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		writeStatus(w, http.StatusBadRequest, "E2b-Sandbox-Port must be a port number 1-65535, got "+strconv.Quote(port))
		return
	}
	if !validID(id) {
		sandboxGone(w, id, "sandbox not found")
		return
	}
	sb, err := s.d.Get(ctx, "", id)
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			sandboxGone(w, id, "sandbox not found")
			return
		}
		s.writeFilesError(w, r, err)
		return
	}
	if !publicPort(sb, port, keyOK) {
		if err := s.authorizePort(ctx, r, sb, keyOK); err != nil {
			writeStatus(w, http.StatusUnauthorized, err.Error())
			return
		}
	}
	if _, ok := e2bState(sb.State); !ok {
		sandboxGone(w, id, "sandbox not found")
		return
	}
	// Agent resumes an auto-resume sandbox, records API activity for the
	// reaper, and refuses one that is not running.
	rctx, cancel := s.resumeCtx(ctx, sb)
	_, err = s.d.Agent(rctx, sb.Owner, sb.ID)
	cancel()
	if err != nil {
		state, _ := e2bState(sb.State)
		sandboxGone(w, id, "sandbox "+id+" is "+state+": "+err.Error())
		return
	}
	if s.opts.DialPort == nil {
		sandboxGone(w, id, "this server does not relay sandbox ports")
		return
	}
	started := sb.StartedAt
	if sb.CreatedAt.After(started) {
		started = sb.CreatedAt
	}
	if r.Body != nil && r.ContentLength >= 0 && r.ContentLength <= maxBufferedPortBody {
		// A small body is read here and sent from memory: the upstream
		// write then never waits on the client's connection (with the
		// client's body streamed through, ~1% of runCode streams were cut
		// short by the transport closing the sandbox connection).
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBufferedPortBody+1))
		if err != nil || int64(len(body)) != r.ContentLength {
			writeStatus(w, http.StatusBadRequest, "request body shorter or longer than its Content-Length")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	ctx = context.WithValue(ctx, portTargetKey{}, portTarget{id: id, port: port, started: started})
	s.ports.ServeHTTP(w, r.WithContext(ctx))
}

// publicPort says whether a request to port of sb needs no credential:
// only a host-routed one (hostRouted) to a user port (never envd) of a
// sandbox created with E2B's network.allowPublicTraffic: true. Any
// credentials sent are still stripped before relaying.
func publicPort(sb *sandbox.Sandbox, port string, hostRouted bool) bool {
	return hostRouted && port != EnvdPort && sb.PublicTraffic
}

// authorizePort accepts the sandbox's envd access token or its traffic
// access token and, with keyOK (a host-routed request: berth's port rule),
// the API key of the sandbox's owner or the admin; nothing else. Every one
// of them is stripped before the request is relayed (portProxy), so none
// reaches the sandbox.
func (s *Server) authorizePort(ctx context.Context, r *http.Request, sb *sandbox.Sandbox, keyOK bool) error {
	// A replica's signed request stands for the owner's key (cluster mode).
	if p, ok, err := s.d.Auth().ClusterPrincipal(r); err != nil {
		return err
	} else if ok && keyOK {
		if p.Admin || p.Owner == sb.Owner {
			return nil
		}
		return errors.New("the cluster principal does not grant sandbox " + strconv.Quote(sb.ID) + " (only its owner does)")
	}
	if key := r.Header.Get(headerAPIKey); key != "" && keyOK {
		p, err := s.d.Auth().Authenticate(ctx, key)
		if err == nil && (p.Admin || p.Owner == sb.Owner) {
			return nil
		}
		return errors.New(headerAPIKey + " does not grant sandbox " + strconv.Quote(sb.ID) + " (only its owner's key does)")
	}
	if tok := r.Header.Get(headerAccessToken); tok != "" {
		owner, err := s.d.Auth().SandboxByToken(ctx, tok)
		if err == nil && owner.ID == sb.ID {
			return nil
		}
		return errors.New("X-Access-Token is not valid for sandbox " + strconv.Quote(sb.ID))
	}
	if tok := r.Header.Get(headerTrafficToken); tok != "" {
		envd, err := s.d.Auth().EnvdToken(ctx, sb)
		if err == nil && envd != "" && subtle.ConstantTimeCompare([]byte(trafficToken(envd)), []byte(tok)) == 1 {
			return nil
		}
		return errors.New(headerTrafficToken + " is not valid for sandbox " + strconv.Quote(sb.ID))
	}
	msg := "sandbox ports need the sandbox's " + headerAccessToken + " (envdAccessToken) or " + headerTrafficToken + " (trafficAccessToken)"
	if keyOK {
		msg += ", or the owner's " + headerAPIKey
	}
	return errors.New(msg)
}

// portProxy relays one request to its target (from the request's
// context, set by serveSandboxPort). Like berth's own port proxy it uses a
// transport per request: nothing pooled is shared between sandboxes or
// outlives a pause, and a shared transport was seen to cut streamed bodies
// short (a connection closed under a body being copied).
func (s *Server) portProxy() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, _ := r.Context().Value(portTargetKey{}).(portTarget)
		transport := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.dialPort(ctx, t)
			},
			// Keep-alive within this one request: the sandbox's server does
			// not close the connection under the end of the body (a
			// server-side close raced the last chunk, ~1% of runCode
			// streams cut short); the connection closes when it is done.
			MaxIdleConnsPerHost:    1,
			IdleConnTimeout:        time.Second,
			ResponseHeaderTimeout:  5 * time.Minute,
			MaxResponseHeaderBytes: maxPortResponseHeader,
		}
		defer transport.CloseIdleConnections()
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				out := pr.Out
				out.URL.Scheme, out.URL.Host = "http", "sandbox:"+t.port
				out.Host = pr.In.Host
				for _, h := range []string{headerSandboxID, headerSandboxPort, headerAccessToken, headerTrafficToken, headerAPIKey} {
					out.Header.Del(h)
				}
				peer.Strip(out.Header) // the cluster token never reaches a sandbox
				pr.SetXForwarded()
			},
			Transport: transport,
			// A response without Content-Length (runCode's newline-delimited
			// stream) is flushed after every write by ReverseProxy itself.
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				if r.Context().Err() != nil {
					return // the client went away
				}
				s.log.Debug("sandbox port unreachable", "sandbox_id", t.id, "port", t.port, "err", err)
				writeJSON(w, http.StatusBadGateway, struct {
					SandboxID string `json:"sandboxId"`
					Message   string `json:"message"`
					Port      int    `json:"port"`
					Code      int    `json:"code"`
				}{t.id, "The sandbox is running but port is not open", atoiOr0(t.port), http.StatusBadGateway})
			},
		}
		rp.ServeHTTP(w, r)
	})
}

func atoiOr0(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// dialPort connects to the target port. A refused connection to a sandbox
// that started within PortWait is retried until the port accepts or
// PortWait has passed since the start: the template's start command (the
// code interpreter's server) may still be binding the port when the first
// request arrives right after create.
func (s *Server) dialPort(ctx context.Context, t portTarget) (net.Conn, error) {
	if t.id == "" {
		return nil, errs.E(errs.Internal, "sandbox port request without a target")
	}
	deadline := t.started.Add(s.opts.PortWait)
	backoff := 5 * time.Millisecond
	for {
		c, err := s.opts.DialPort(ctx, t.id, t.port)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || !s.opts.Now().Add(backoff).Before(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 200*time.Millisecond)
	}
}
