package hostnet

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// SecretInfo is a secret as the API shows it: never its value.
type SecretInfo struct {
	Name      string    `json:"name"`
	Host      string    `json:"host"`
	Header    string    `json:"header"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// DefaultSecretHeader is the header template when none is given.
const DefaultSecretHeader = "Authorization: Bearer {{value}}"

// A secret's name is the env var that holds its placeholder in a sandbox.
var secretNameRe = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

func secretAAD(owner, name string) []byte { return []byte(owner + "/" + name) }

func infoOf(s store.Secret) SecretInfo {
	return SecretInfo{Name: s.Name, Host: s.Host, Header: s.Header, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

// PutSecret stores (or replaces) owner's secret, sealed at rest. Running
// sandboxes it is granted to use the new value from their next request.
func (h *Service) PutSecret(ctx context.Context, owner, name, host, header string, value []byte) (SecretInfo, error) {
	if h.net == nil {
		return SecretInfo{}, errs.E(errs.FailedPrecondition, "networking is disabled on this server: secrets cannot be used")
	}
	if !secretNameRe.MatchString(name) {
		return SecretInfo{}, errs.Field("name", "must be an env var name ([A-Za-z_][A-Za-z0-9_]*, up to 64), got %q", name)
	}
	if header == "" {
		header = DefaultSecretHeader
	}
	if len(value) == 0 {
		return SecretInfo{}, errs.Field("value", "must not be empty")
	}
	// Validate as the proxy will use it.
	g := egress.Grant{Name: name, Host: host, HeaderTemplate: header, Value: string(value), Placeholder: egress.NewPlaceholder(name)}
	if err := g.Validate(); err != nil {
		return SecretInfo{}, err
	}
	if r, err := egress.ParseRule(host); err != nil || r.Kind != egress.RuleHost || r.Port != 0 {
		return SecretInfo{}, errs.Field("host", "must be a hostname without port or wildcard, got %q", host)
	}
	sealed, err := h.net.sealer.Seal(value, secretAAD(owner, name))
	if err != nil {
		return SecretInfo{}, err
	}
	stored, err := h.core.Store().PutSecret(ctx, store.Secret{Owner: owner, Name: name, Host: host, Header: header,
		Sealed: sealed, UpdatedAt: h.core.Now()})
	if err != nil {
		return SecretInfo{}, err
	}
	h.secretsChanged.Add(1)
	h.refreshGrants(ctx, owner, name)
	return infoOf(stored), nil
}

// ListSecrets lists owner's secrets ("" = every owner).
func (h *Service) ListSecrets(ctx context.Context, owner string) ([]SecretInfo, error) {
	list, err := h.core.Store().ListSecrets(ctx, owner)
	if err != nil {
		return nil, err
	}
	out := make([]SecretInfo, 0, len(list))
	for _, s := range list {
		out = append(out, infoOf(s))
	}
	return out, nil
}

// DeleteSecret removes owner's secret; sandboxes it was granted to stop
// getting it injected at once.
func (h *Service) DeleteSecret(ctx context.Context, owner, name string) error {
	if err := h.core.Store().DeleteSecret(ctx, owner, name); err != nil {
		return err
	}
	h.secretsChanged.Add(1)
	h.refreshGrants(ctx, owner, name)
	return nil
}

// LeaseSource is the credential-lease service (internal/leases) as the
// proxy sees it: the leases of a sandbox to register, issuing those its
// grants lack first.
type LeaseSource interface {
	ProxyLeases(ctx context.Context, sb *sandbox.Sandbox) ([]LeaseGrant, error)
}

// LeaseGrant is one lease the proxy honours (State "" active, frozen, revoked).
type LeaseGrant struct {
	Lease, Secret, Host, Placeholder, State string
	Expires                                 time.Time
}

// SetLeases makes the proxy's grants follow the sandbox's leases (set once
// in daemon.New, before any sandbox is attached).
func (h *Service) SetLeases(ls LeaseSource) { h.leases = ls }

// RefreshGrants re-registers sb's grants with the proxy if it is attached
// (the lease service calls it after a change).
func (h *Service) RefreshGrants(ctx context.Context, sb *sandbox.Sandbox) error {
	if h.net == nil {
		return nil
	}
	if _, ok := h.net.mgr.Get(sb.ID); !ok {
		return nil
	}
	return h.applyGrants(ctx, sb)
}

// PrepareLeaseGrants opens the secrets of ls (as LeaseSource.ProxyLeases
// returns them: the lease service's own change, not read again) now, and
// returns set, which registers them as sb's grants with the proxy if sb is
// attached then (a resume opens them before its commit, sets them after).
func (h *Service) PrepareLeaseGrants(ctx context.Context, sb *sandbox.Sandbox, ls []LeaseGrant) (set func() error, err error) {
	if h.net == nil {
		return func() error { return nil }, nil
	}
	gen := h.secretsChanged.Load()
	gs, err := h.openLeaseGrants(ctx, sb, ls)
	if err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	return func() error {
		if _, ok := h.net.mgr.Get(sb.ID); !ok {
			return nil
		}
		if h.secretsChanged.Load() != gen { // a secret changed in between: open them again
			if gs, err = h.openLeaseGrants(ctx, sb, ls); err != nil {
				return err
			}
		}
		return h.net.px.SetGrants(sb.ID, gs)
	}, nil
}

// FreezeGrants marks sb's active grants frozen in the proxy at once (a
// pause; the lease service's records say the same, derived from the
// sandbox's state).
func (h *Service) FreezeGrants(id string) {
	if h.net != nil {
		h.net.px.FreezeGrants(id)
	}
}

// leaseGrants opens the secrets of sb's leases; only an active lease's
// value is opened (the proxy never injects another's).
func (h *Service) leaseGrants(ctx context.Context, sb *sandbox.Sandbox) ([]egress.Grant, error) {
	ls, err := h.leases.ProxyLeases(ctx, sb)
	if err != nil {
		return nil, err
	}
	return h.openLeaseGrants(ctx, sb, ls)
}

// openLeaseGrants is leaseGrants of the leases ls.
func (h *Service) openLeaseGrants(ctx context.Context, sb *sandbox.Sandbox, ls []LeaseGrant) ([]egress.Grant, error) {
	var err error
	var out []egress.Grant
	secs := map[string]store.Secret{}
	for _, l := range ls {
		sec, ok := secs[l.Secret]
		if !ok {
			if sec, err = h.core.Store().GetSecret(ctx, sb.Owner, l.Secret); errs.Is(err, errs.NotFound) {
				continue
			} else if err != nil {
				return nil, err
			}
			secs[l.Secret] = sec
		}
		g := egress.Grant{Name: l.Secret, Host: l.Host, HeaderTemplate: sec.Header, Placeholder: l.Placeholder,
			Lease: l.Lease, State: l.State, Expires: l.Expires}
		if l.State == egress.GrantActive {
			val, err := h.net.sealer.Open(sec.Sealed, secretAAD(sec.Owner, sec.Name))
			if err != nil {
				return nil, errs.Wrap(errs.Internal, err, "open secret %s", l.Secret)
			}
			g.Value = string(val)
		}
		out = append(out, g)
	}
	return out, nil
}

// grants opens the secrets granted to sb. A secret deleted since it was
// granted is skipped: its placeholder then reaches the server unreplaced.
func (h *Service) grants(ctx context.Context, sb *sandbox.Sandbox) ([]egress.Grant, error) {
	if h.leases != nil {
		return h.leaseGrants(ctx, sb)
	}
	var out []egress.Grant
	for _, ref := range grantRefs(sb) {
		sec, err := h.core.Store().GetSecret(ctx, sb.Owner, ref.Name)
		if errs.Is(err, errs.NotFound) {
			h.core.Log().Warn("granted secret no longer exists", "sandbox_id", sb.ID, "secret", ref.Name)
			continue
		}
		if err != nil {
			return nil, err
		}
		val, err := h.net.sealer.Open(sec.Sealed, secretAAD(sec.Owner, sec.Name))
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "open secret %s", ref.Name)
		}
		out = append(out, egress.Grant{Name: ref.Name, Host: sec.Host, HeaderTemplate: sec.Header,
			Value: string(val), Placeholder: ref.Placeholder})
	}
	return out, nil
}

// applyGrants registers sb's grants with the proxy (after Attach, and again
// after a daemon restart: grants live in memory only).
func (h *Service) applyGrants(ctx context.Context, sb *sandbox.Sandbox) error {
	gs, err := h.grants(ctx, sb)
	if err != nil {
		return err
	}
	return h.net.px.SetGrants(sb.ID, gs)
}

// refreshGrants re-registers the grants of owner's attached sandboxes that
// were granted secret name.
func (h *Service) refreshGrants(ctx context.Context, owner, name string) {
	list, _, err := h.core.Store().ListSandboxes(ctx, store.SandboxFilter{Owner: owner})
	if err != nil {
		h.core.Log().Error("refresh grants", "owner", owner, "err", err)
		return
	}
	for _, sb := range list {
		if _, ok := h.net.mgr.Get(sb.ID); !ok {
			continue
		}
		for _, ref := range grantRefs(sb) {
			if ref.Name == name {
				if err := h.applyGrants(ctx, sb); err != nil {
					h.core.Log().Error("refresh grants", "sandbox_id", sb.ID, "err", err)
				}
				break
			}
		}
	}
}
