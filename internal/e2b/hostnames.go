package e2b

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Sandbox host names: with Options.Domain set, "<port>-<id>.<domain>" is
// a sandbox port addressed the way E2B SDKs address it when no
// E2B_SANDBOX_URL is set (envd at https://49983-<id>.<domain>) and the way
// sbx.getHost(port) always does. The host name only routes; access is
// decided as for header-routed ports (authorizePort: the sandbox's envd or
// traffic token) plus, as berth's own port rule has it, the owner's API
// key; envd (serveEnvd: the envd
// token), and the relay is the same (serveSandboxPort). "api.<domain>" and
// the domain itself are the control plane and berth's own API, so the SDK
// default E2B_API_URL (https://api.<domain>) works too. TLS for these names
// is internal/sandboxca's.

// apiLabel is the control plane's host label (the SDK's https://api.<domain>).
const apiLabel = "api"

// hostTarget is a sandbox port named by a Host header.
type hostTarget struct {
	id, port string
}

// parseSandboxHost parses host (a Host header, optionally with :port)
// under domain (normalized: lower case, no trailing dot). ok is false for
// names that are not sandbox names (outside the domain, the domain itself,
// api.<domain>); a name under the domain that is not "<port>-<id>" is an
// InvalidArgument naming the field "host" and what is wrong.
func parseSandboxHost(host, domain string) (t hostTarget, ok bool, err error) {
	if domain == "" {
		return hostTarget{}, false, nil
	}
	if h, _, serr := net.SplitHostPort(host); serr == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, under := strings.CutSuffix(host, "."+domain)
	if !under || label == apiLabel {
		return hostTarget{}, false, nil
	}
	if label == "" || strings.Contains(label, ".") {
		return hostTarget{}, true, errs.Field("host", "must be <port>-<sandboxID>.%s (one label under the domain), got %q", domain, host)
	}
	port, id, found := strings.Cut(label, "-")
	if !found {
		return hostTarget{}, true, errs.Field("host", "must be <port>-<sandboxID>.%s, got %q (no '-')", domain, host)
	}
	if n, perr := strconv.Atoi(port); perr != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return hostTarget{}, true, errs.Field("host", "port must be a number 1-65535 without leading zeros, got %q in %q", port, host)
	}
	// A legacy "-<clientID>" suffix is dropped; it must be of the id charset too.
	id, client, hasClient := strings.Cut(id, "-")
	if !validID(id) {
		return hostTarget{}, true, errs.Field("host", "sandbox id must be 1-64 of [a-z0-9], got %q in %q", id, host)
	}
	if hasClient && !validID(client) {
		return hostTarget{}, true, errs.Field("host", "client id suffix must be of [a-z0-9], got %q in %q", client, host)
	}
	return hostTarget{id: id, port: port}, true, nil
}

// serveHostRouted serves a request whose Host names a sandbox port. The
// routing headers, when present, must agree with the host name: a request
// cannot name one sandbox in its Host (and TLS server name) and another
// in E2b-Sandbox-Id.
func (s *Server) serveHostRouted(w http.ResponseWriter, r *http.Request, t hostTarget) {
	if hid := r.Header.Get(headerSandboxID); hid != "" && stripClientID(hid) != t.id {
		writeStatus(w, http.StatusBadRequest, headerSandboxID+" "+strconv.Quote(hid)+" does not match the host name's sandbox "+strconv.Quote(t.id))
		return
	}
	if hp := strings.TrimSpace(r.Header.Get(headerSandboxPort)); hp != "" && hp != t.port {
		writeStatus(w, http.StatusBadRequest, headerSandboxPort+" "+strconv.Quote(hp)+" does not match the host name's port "+strconv.Quote(t.port))
		return
	}
	if r.TLS != nil && r.TLS.ServerName != "" {
		// The TLS server name picked the certificate; HTTP/2 may reuse a
		// connection for another name only when that certificate covers it,
		// and ours cover one name each: a mismatch is a confused client.
		if sn, _, _ := parseSandboxHost(r.TLS.ServerName, s.opts.Domain); sn != t {
			writeStatus(w, http.StatusMisdirectedRequest, "host "+strconv.Quote(r.Host)+" does not match the TLS server name "+strconv.Quote(r.TLS.ServerName))
			return
		}
	}
	if t.port == EnvdPort {
		s.serveEnvd(w, r, t.id)
		return
	}
	s.serveSandboxPort(w, r, t.id, t.port, true)
}

// resumeCtx bounds how long a request to a paused auto-resume sandbox
// waits for its resume (the request itself may run longer afterwards).
func (s *Server) resumeCtx(ctx context.Context, sb *sandbox.Sandbox) (context.Context, context.CancelFunc) {
	if sb.State == sandbox.Paused && sb.AutoResume {
		return context.WithTimeout(ctx, s.opts.ResumeWait)
	}
	return ctx, func() {}
}

// defaultResumeWait is Options.ResumeWait's default.
const defaultResumeWait = 2 * time.Minute
