package hostnet

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"maps"
	"net"
	"sort"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// PortInfo is an exposed sandbox port.
type PortInfo struct {
	Port      int       `json:"port"`
	Token     bool      `json:"token"` // a per-port token also grants access
	CreatedAt time.Time `json:"created_at"`
}

// portEntry is the persisted form (Attrs.Net.Ports); only the token's hash.
type portEntry = sandbox.PortGrant

// portEntries is a copy of sb's exposed ports, safe to modify.
func portEntries(sb *sandbox.Sandbox) map[string]portEntry {
	m := maps.Clone(sb.Net.Ports)
	if m == nil {
		m = map[string]portEntry{}
	}
	return m
}

func portInfos(sb *sandbox.Sandbox) []PortInfo {
	var out []PortInfo
	for k, e := range portEntries(sb) {
		n, _ := strconv.Atoi(k)
		out = append(out, PortInfo{Port: n, Token: e.TokenHash != "", CreatedAt: e.CreatedAt})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out
}

var tokenHash = auth.TokenHash

// newToken is 24 random bytes in hex.
func newToken() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func parsePort(port string) (int, error) {
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return 0, errs.Field("port", "must be 1-65535, got %q", port)
	}
	return n, nil
}

// ExposePort opens a sandbox port through berth's HTTP proxy. With
// withToken a fresh per-port token (returned once, stored hashed) grants
// access besides the owner's key; exposing again replaces the token.
func (h *Service) ExposePort(ctx context.Context, owner, id string, port int, withToken bool) (PortInfo, string, error) {
	if h.net == nil {
		return PortInfo{}, "", errs.E(errs.FailedPrecondition, "networking is disabled on this server: ports cannot be exposed")
	}
	if port < 1 || port > 65535 {
		return PortInfo{}, "", errs.Field("port", "must be 1-65535, got %d", port)
	}
	if _, err := h.core.Visible(ctx, owner, id); err != nil {
		return PortInfo{}, "", err
	}
	tok := ""
	e := portEntry{CreatedAt: h.core.Now().UTC()}
	if withToken {
		tok = "bpt_" + newToken()
		e.TokenHash = tokenHash(tok)
	}
	sb, err := h.core.Store().UpdateSandbox(ctx, id, func(s *sandbox.Sandbox) error {
		m := portEntries(s)
		m[strconv.Itoa(port)] = e
		s.Net.Ports = m
		return nil
	})
	if err != nil {
		return PortInfo{}, "", err
	}
	h.core.Event(ctx, sb, owner, "network", "port_exposed", "", map[string]string{"port": strconv.Itoa(port), "token": strconv.FormatBool(withToken)})
	return PortInfo{Port: port, Token: withToken, CreatedAt: e.CreatedAt}, tok, nil
}

// ClosePort stops exposing a port (NotFound if it was not exposed).
func (h *Service) ClosePort(ctx context.Context, owner, id string, port int) error {
	sb, err := h.core.Visible(ctx, owner, id)
	if err != nil {
		return err
	}
	if _, ok := portEntries(sb)[strconv.Itoa(port)]; !ok {
		return errs.E(errs.NotFound, "port %d of sandbox %s is not exposed", port, id)
	}
	sb, err = h.core.Store().UpdateSandbox(ctx, id, func(s *sandbox.Sandbox) error {
		m := portEntries(s)
		delete(m, strconv.Itoa(port))
		s.Net.Ports = m
		return nil
	})
	if err != nil {
		return err
	}
	h.core.Event(ctx, sb, owner, "network", "port_closed", "", map[string]string{"port": strconv.Itoa(port)})
	return nil
}

// Ports lists a sandbox's exposed ports.
func (h *Service) Ports(ctx context.Context, owner, id string) ([]PortInfo, error) {
	sb, err := h.core.Visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return portInfos(sb), nil
}

// AuthorizePort decides whether a request may reach port of sandbox id:
// the owner's (or the admin) API key, or the port's token. A port that is
// not exposed, or a sandbox the caller cannot see, is NotFound.
func (h *Service) AuthorizePort(ctx context.Context, apiKey, token, id, port string) error {
	return h.authorizePort(ctx, nil, apiKey, token, id, port)
}

// AuthorizePortAs is AuthorizePort for a caller already authenticated as
// p (cluster mode: an API replica's signed request): its owner or the admin.
func (h *Service) AuthorizePortAs(ctx context.Context, p auth.Principal, id, port string) error {
	return h.authorizePort(ctx, &p, "", "", id, port)
}

func (h *Service) authorizePort(ctx context.Context, caller *auth.Principal, apiKey, token, id, port string) error {
	n, err := parsePort(port)
	if err != nil {
		return err
	}
	sb, err := h.core.Visible(ctx, "", id)
	if err != nil {
		return err
	}
	e, ok := portEntries(sb)[strconv.Itoa(n)]
	if !ok {
		return errs.E(errs.NotFound, "port %d of sandbox %s is not exposed", n, id)
	}
	if caller != nil {
		if caller.Admin || caller.Owner == sb.Owner {
			return h.portReady(sb)
		}
		return errs.E(errs.PermissionDenied, "%s may not reach port %d of sandbox %s", caller.Owner, n, id)
	}
	if apiKey != "" {
		if p, err := h.authn.Authenticate(ctx, apiKey); err == nil && (p.Admin || p.Owner == sb.Owner) {
			return h.portReady(sb)
		}
	}
	if token != "" && e.TokenHash != "" &&
		subtle.ConstantTimeCompare([]byte(tokenHash(token)), []byte(e.TokenHash)) == 1 {
		return h.portReady(sb)
	}
	if apiKey == "" && token == "" {
		return errs.E(errs.Unauthenticated, "port %d of sandbox %s needs the owner's API key or the port's token (?token=)", n, id)
	}
	return errs.E(errs.PermissionDenied, "this key or token does not grant port %d of sandbox %s", n, id)
}

func (h *Service) portReady(sb *sandbox.Sandbox) error {
	if sb.State != sandbox.Running {
		return errs.E(errs.Unavailable, "sandbox %s is %s, not running", sb.ID, sb.State)
	}
	return nil
}

// DialPort connects to a sandbox port from the host (after AuthorizePort).
func (h *Service) DialPort(ctx context.Context, id, port string) (net.Conn, error) {
	n, err := parsePort(port)
	if err != nil {
		return nil, err
	}
	if h.net == nil {
		return nil, errs.E(errs.FailedPrecondition, "networking is disabled on this server")
	}
	return h.net.mgr.DialSandbox(ctx, id, uint16(n))
}
