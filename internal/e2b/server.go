// Package e2b serves the E2B-compatible surface of berth: the control-plane
// REST API (create, list, timeout, pause, connect, kill) and envd, the
// per-sandbox process and filesystem API (Connect RPCs plus REST /files and
// /health), so the unmodified E2B SDKs work against a berth server. The
// protocol reference is e2b-protocol.md; this package translates it onto
// the daemon and the in-sandbox agent.
package e2b

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/audit"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/notes"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// EnvdVersion is the envd version berth reports; the SDK gates features on
// it. 0.5.7 enables raw (octet-stream, gzip) uploads and closeStdin, 0.6.3
// watch includeEntry and 0.6.4 watch allowNetworkMounts. 0.6.2 also lets
// the SDK send file metadata headers (X-Metadata-*), which berth does not
// store yet: an upload carrying them is refused rather than silently
// losing them (envd_files.go).
const EnvdVersion = "0.6.4"

// clientID is the deprecated, required Sandbox.clientID; E2B always sends this.
const clientID = "6532622b"

// Backend is the subset of *daemon.Daemon the E2B surface uses.
type Backend interface {
	Create(ctx context.Context, req daemon.CreateRequest) (*sandbox.Sandbox, error)
	Get(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, f daemon.ListFilter) ([]*sandbox.Sandbox, string, error)
	Delete(ctx context.Context, owner, id string) error
	SetExpiry(ctx context.Context, owner, id string, at time.Time) (*sandbox.Sandbox, error)
	Agent(ctx context.Context, owner, id string) (*agentapi.Client, error)

	// API keys and envd access tokens (Authenticate, EnvdToken,
	// SandboxByToken); sandbox stats (cp_metrics.go).
	Auth() *auth.Service
	Admission() *admission.Service

	// Pause, resume and fork (cp_lifecycle.go, cp_snapshots.go); snapshots.
	Checkpoints() *checkpoint.Service
	Snapshots() *checkpoint.Snapshots
	Store() store.Store
	// Notes: the handoff note returned on connect (an extra field the SDKs ignore).
	Notes() *notes.Service
	// Audit is the audit chain: each control-plane call is an entry (audit.go).
	Audit() *audit.Service
}

// Options configure the E2B surface. Zero values are usable.
type Options struct {
	// Domain is returned as the sandbox domain; "" returns null, so SDKs use
	// E2B_SANDBOX_URL or their own E2B_DOMAIN. Set, requests for
	// "<port>-<id>.<Domain>" are routed to that sandbox port
	// (hostnames.go). Normalized: lower case, no trailing dot.
	Domain string
	// ResumeWait bounds how long a request to a paused auto-resume
	// sandbox waits for the resume. Default 2m.
	ResumeWait time.Duration
	// BaseTemplate is the berth template that serves E2B's "base" template.
	// Default "default".
	BaseTemplate string
	// MaxTimeout caps sandbox timeouts (create, connect, setTimeout).
	// Default 24h.
	MaxTimeout time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// DialPort connects from the host to a port of a running sandbox
	// (hostnet's DialPort, the path berth's own port proxy uses). nil:
	// requests for sandbox ports other than envd answer 502.
	DialPort func(ctx context.Context, id, port string) (net.Conn, error)
	// PortWait bounds how long a request to a sandbox port waits for the
	// port to accept connections when the sandbox has just started (its
	// start command may still be binding it). Default 30s.
	PortWait time.Duration
}

// Server is the E2B surface. Create it with New and mount Handler.
type Server struct {
	d     Backend
	log   *slog.Logger
	opts  Options
	cp    http.Handler
	envd  http.Handler
	ports http.Handler // sandbox ports other than envd (sandboxport.go)

	metrics metricsHistory
}

// New builds the E2B surface over d.
func New(d Backend, log *slog.Logger, opts Options) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.BaseTemplate == "" {
		opts.BaseTemplate = "default"
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = 24 * time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ResumeWait <= 0 {
		opts.ResumeWait = defaultResumeWait
	}
	if opts.PortWait <= 0 {
		opts.PortWait = 30 * time.Second
	}
	s := &Server{d: d, log: log.With("component", "e2b"), opts: opts}
	s.cp = s.controlPlane()
	s.envd = s.envdMux()
	s.ports = s.portProxy()
	return s
}

// Handler routes E2B traffic and hands everything else to next (berth's own
// /v1 API): a Host "<port>-<id>.<Domain>" goes to that sandbox port
// (hostnames.go); requests addressed to a sandbox (E2b-Sandbox-Id, Host
// "49983-<id>.<domain>", or an X-Access-Token without an API key) go to
// envd, or with E2b-Sandbox-Port naming another port to that port of the
// sandbox; E2B control-plane paths go to the control plane.
func (s *Server) Handler(next http.Handler) http.Handler {
	if next == nil {
		next = http.NotFoundHandler()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t, ok, err := parseSandboxHost(r.Host, s.opts.Domain); err != nil {
			writeStatus(w, http.StatusBadRequest, err.Error())
			return
		} else if ok {
			s.serveHostRouted(w, r, t)
			return
		}
		switch rt := decideRoute(r); rt.Dest {
		case toEnvd:
			s.serveEnvd(w, r, rt.SandboxID)
		case toPort:
			s.serveSandboxPort(w, r, rt.SandboxID, rt.Port, false)
		case toControlPlane:
			s.cp.ServeHTTP(w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}
