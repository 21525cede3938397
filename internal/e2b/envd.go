package e2b

import (
	"context"
	"net/http"
	"strconv"

	"github.com/berth-dev/berth/api/gen/filesystem/filesystemconnect"
	"github.com/berth-dev/berth/api/gen/process/processconnect"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// envdTarget is the sandbox an envd request addresses, resolved and
// authorised by serveEnvd before any envd handler runs.
type envdTarget struct {
	sb    *sandbox.Sandbox
	agent *agentapi.Client
}

type targetKey struct{}

func targetFrom(ctx context.Context) envdTarget {
	t, _ := ctx.Value(targetKey{}).(envdTarget)
	return t
}

// envdMux serves envd's routes for an already resolved target.
func (s *Server) envdMux() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /files", s.handleFilesGet)
	mux.HandleFunc("POST /files", s.handleFilesPost)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, http.StatusNotFound, "no envd route "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// sandboxGone is the router's answer for a missing, killed or paused target
// (§2): 502 {"sandboxId","message","code"}. The SDK maps it to
// isRunning() == false, TimeoutError or SandboxNotFoundError.
func sandboxGone(w http.ResponseWriter, id, msg string) {
	writeJSON(w, http.StatusBadGateway, struct {
		SandboxID string `json:"sandboxId"`
		Message   string `json:"message"`
		Code      int    `json:"code"`
	}{id, msg, http.StatusBadGateway})
}

// serveEnvd resolves the target sandbox by its access token (every berth
// sandbox has a unique one), checks it against the addressed id, gets the
// sandbox's agent (auto-resuming when the sandbox allows it) and serves the
// request. id is "" for old SDKs that send only X-Access-Token.
func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request, id string) {
	ctx := r.Context()
	token := r.Header.Get(headerAccessToken)
	if token == "" && id != "" && r.Method == http.MethodGet && r.URL.Path == "/health" {
		// §8: /health needs no auth; it only says whether the sandbox runs.
		if sb, err := s.d.Get(ctx, "", id); err == nil && sb.State == sandbox.Running {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		sandboxGone(w, id, "sandbox not found")
		return
	}
	if token == "" && isSignedFiles(r) {
		// A signed file URL (envd_signed.go): the signature stands in for the token.
		sb, err := s.signedTarget(ctx, r, id)
		switch {
		case errs.Is(err, errs.NotFound):
			sandboxGone(w, id, "sandbox not found")
		case err != nil:
			s.writeFilesError(w, r, err)
		default:
			s.serveEnvdTo(w, r, sb)
		}
		return
	}
	if token == "" {
		writeStatus(w, http.StatusUnauthorized, "missing X-Access-Token header (the envdAccessToken of sandbox "+strconv.Quote(id)+")")
		return
	}
	sb, err := s.d.Auth().SandboxByToken(ctx, token)
	switch {
	case errs.Is(err, errs.NotFound):
		// A live sandbox addressed with someone else's (or a made-up) token
		// is a 401; a sandbox that is gone is the router's 502.
		if other, gerr := s.d.Get(ctx, "", id); id != "" && gerr == nil && other.State == sandbox.Running {
			writeStatus(w, http.StatusUnauthorized, "X-Access-Token is not valid for sandbox "+strconv.Quote(id))
			return
		}
		sandboxGone(w, id, "sandbox not found")
		return
	case err != nil:
		s.writeFilesError(w, r, err)
		return
	case id != "" && sb.ID != id:
		writeStatus(w, http.StatusUnauthorized, "X-Access-Token is not valid for sandbox "+strconv.Quote(id))
		return
	}
	s.serveEnvdTo(w, r, sb)
}

// serveEnvdTo serves an envd request for sb, already authorised: it gets
// the sandbox's agent (auto-resuming when the sandbox allows it).
func (s *Server) serveEnvdTo(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox) {
	ctx := r.Context()
	if sb.State != sandbox.Running && !(sb.AutoResume && (sb.State == sandbox.Paused || sb.State == sandbox.Resuming)) {
		state, ok := e2bState(sb.State)
		if !ok {
			sandboxGone(w, sb.ID, "sandbox not found")
			return
		}
		sandboxGone(w, sb.ID, "sandbox "+sb.ID+" is "+state)
		return
	}
	rctx, cancel := s.resumeCtx(ctx, sb)
	agent, err := s.d.Agent(rctx, sb.Owner, sb.ID)
	cancel()
	if err != nil {
		switch errs.KindOf(err) {
		case errs.NotFound, errs.Unavailable, errs.FailedPrecondition, errs.Conflict:
			s.log.Debug("envd target unavailable", "sandbox_id", sb.ID, "err", err)
			sandboxGone(w, sb.ID, err.Error())
		default:
			s.writeFilesError(w, r, err)
		}
		return
	}
	ctx = context.WithValue(ctx, targetKey{}, envdTarget{sb: sb, agent: agent})
	s.envd.ServeHTTP(w, r.WithContext(ctx))
}

// rpcUser is the OS user of an RPC: the Basic-auth username, or "" for the
// agent's default ("user" when it exists).
func rpcUser(h http.Header) string {
	u, _, _ := (&http.Request{Header: h}).BasicAuth()
	return u
}

// keepaliveSec is the stream keepalive interval the client asked for
// (Keepalive-Ping-Interval, seconds); E2B's default is 90.
func keepaliveSec(h http.Header) int {
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		return n
	}
	return 90
}
