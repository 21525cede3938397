package hostnet

import (
	"context"
	"slices"
	"strings"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Info is a sandbox's network as the API shows it.
type Info struct {
	SandboxID string        `json:"sandbox_id"`
	Policy    egress.Policy `json:"policy"`
	Attached  bool          `json:"attached"`
	IP        string        `json:"ip,omitempty"`
	Secrets   []string      `json:"secrets,omitempty"`
	Ports     []PortInfo    `json:"ports,omitempty"`
}

// policyOf reads a sandbox's stored policy; none stored is deny-all.
func policyOf(sb *sandbox.Sandbox) (egress.Policy, error) {
	return egress.UnmarshalPolicy(sb.Net.Policy)
}

func grantRefs(sb *sandbox.Sandbox) []sandbox.SecretGrant { return sb.Net.Secrets }

// BuildPolicy turns a mode and rule strings into a policy, as `berth create`
// and `berth net set` take them. mode "" is the server default; deny-all
// with rules means "deny by default, allow these" (mode rules). A malformed
// rule is an InvalidArgument error naming it.
func (h *Service) BuildPolicy(mode string, allow, deny []string) (egress.Policy, error) {
	def := egress.DenyAll
	if h.net != nil {
		def = h.net.def
	}
	pol, err := PlanPolicy(def, h.net != nil, mode, allow, deny)
	if err != nil {
		return egress.Policy{}, err
	}
	if h.net != nil {
		if err := h.net.px.CheckPolicy(pol); err != nil {
			return egress.Policy{}, err
		}
	}
	return pol, nil
}

// PlanPolicy is BuildPolicy's pure part: the policy a mode and rule strings
// make on a server whose default mode is def, with networking enabled or
// not (then only deny-all, possibly as rules allowing nothing, is possible).
func PlanPolicy(def egress.Mode, enabled bool, mode string, allow, deny []string) (egress.Policy, error) {
	m := egress.Mode(mode)
	switch m {
	case "":
		m = def
		if m == "" {
			m = egress.DenyAll
		}
		if len(allow) > 0 || (m == egress.DenyAll && len(deny) > 0) {
			m = egress.Rules
		}
	case egress.DenyAll:
		if len(allow)+len(deny) > 0 {
			m = egress.Rules
		}
	case egress.AllowAll, egress.Rules:
	default:
		return egress.Policy{}, errs.Field("network", "must be deny-all, allow-all or rules, got %q", mode)
	}
	pol, err := egress.ParsePolicy(string(m), allow, deny)
	if err != nil {
		return egress.Policy{}, err
	}
	if !enabled && pol.Mode != egress.DenyAll && !(pol.Mode == egress.Rules && len(pol.Allow) == 0) {
		return egress.Policy{}, errs.E(errs.FailedPrecondition, "networking is disabled on this server: only deny-all is possible")
	}
	return pol, nil
}

// Request is the network part of a create request, filled in by Prepare.
type Request struct {
	Owner string
	// Network is the egress policy mode ("" = server default), Allow and
	// Deny its rules, Secrets the secrets to grant.
	Network              string
	Allow, Deny, Secrets []string
	// Effects marks the side effects the ledger records; a fork's
	// inherited policy keeps its own unless the request names a policy.
	Effects egress.EffectPolicy
	// Env and Net are the create's; Prepare adds the placeholders of
	// granted secrets to Env and the policy and grants to Net (Env may be
	// nil on entry; a Net that holds a policy is a fork's, kept).
	Env map[string]string
	Net sandbox.NetState
}

// Prepare fills a create request's network part: the policy (from
// Network/Allow/Deny, or the server default), the granted secrets (their
// hosts allowed, placeholders in env), all persisted in the sandbox's
// Attrs.Net. A request whose Net already holds a policy (a fork) keeps it
// unless it names one.
func (h *Service) Prepare(ctx context.Context, req *Request) error {
	var pol egress.Policy
	var err error
	if prev := req.Net.Policy; len(prev) > 0 && req.Network == "" && len(req.Allow)+len(req.Deny) == 0 {
		if pol, err = egress.UnmarshalPolicy(prev); err != nil {
			return err
		}
	} else if pol, err = h.BuildPolicy(req.Network, req.Allow, req.Deny); err != nil {
		return err
	}
	if !req.Effects.IsZero() {
		pol.Effects = req.Effects
	}
	refs := slices.Clone(req.Net.Secrets)
	for _, name := range req.Secrets {
		if h.net == nil {
			return errs.E(errs.FailedPrecondition, "networking is disabled on this server: secrets cannot be granted")
		}
		sec, err := h.core.Store().GetSecret(ctx, req.Owner, name)
		if errs.Is(err, errs.NotFound) {
			return errs.Field("secret", "unknown secret %q (create it with `berth secret set %s --host HOST`)", name, name)
		}
		if err != nil {
			return err
		}
		if _, clash := req.Env[name]; clash {
			return errs.Field("env", "%s is set both as env and as a granted secret", name)
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		ph := egress.NewPlaceholder(name)
		req.Env[name] = ph
		refs = append(refs, sandbox.SecretGrant{Name: name, Placeholder: ph})
		pol = allowHost(pol, sec.Host)
	}
	b, err := egress.MarshalPolicy(pol)
	if err != nil {
		return err
	}
	req.Net.Policy, req.Net.Secrets = b, refs
	return nil
}

// SetLedger installs the side-effect ledger the egress proxy records
// effects in (internal/effects); call it before Start.
func (h *Service) SetLedger(l egress.Ledger) { h.ledger = l }

// allowHost makes sure pol lets connections to host through.
func allowHost(pol egress.Policy, host string) egress.Policy {
	r, err := egress.ParseRule(host)
	if err != nil || pol.Mode == egress.AllowAll {
		return pol
	}
	for _, a := range pol.Allow {
		if a == r {
			return pol
		}
	}
	pol.Mode = egress.Rules
	pol.Allow = append(pol.Allow, r)
	return pol
}

// SetPolicy replaces a sandbox's policy; a running sandbox gets it
// at once (connections the new policy denies are closed).
func (h *Service) SetPolicy(ctx context.Context, owner, id, actor string, pol egress.Policy) (*Info, error) {
	b, err := egress.MarshalPolicy(pol)
	if err != nil {
		return nil, err
	}
	if h.net == nil && pol.Mode != egress.DenyAll {
		return nil, errs.E(errs.FailedPrecondition, "networking is disabled on this server: only deny-all is possible")
	}
	if h.net != nil {
		if err := h.net.px.CheckPolicy(pol); err != nil {
			return nil, err
		}
	}
	unlock := h.core.Lock(id)
	defer unlock()
	sb, err := h.core.Visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	prev := sb.Net.Policy
	setPolicy := func(v []byte) func(*sandbox.Sandbox) error {
		return func(s *sandbox.Sandbox) error {
			s.Net.Policy = v
			return nil
		}
	}
	// Intent first: a crash after this is settled by Reconcile.
	if sb, err = h.core.Store().UpdateSandbox(ctx, id, setPolicy(b)); err != nil {
		return nil, err
	}
	if h.net != nil {
		if _, attached := h.net.mgr.Get(id); attached {
			if err := h.net.mgr.UpdatePolicy(ctx, id, pol); err != nil {
				_, _ = h.core.Store().UpdateSandbox(context.WithoutCancel(ctx), id, setPolicy(prev))
				return nil, err
			}
		}
	}
	ev := map[string]string{"mode": string(pol.Mode), "allow": joinRules(pol.Allow), "deny": joinRules(pol.Deny)}
	if !pol.Effects.IsZero() {
		ev["effectful"], ev["idempotency"], ev["repeat"] = joinRules(pol.Effects.Hosts), pol.Effects.Idempotency, pol.Effects.Repeat
	}
	h.core.Event(ctx, sb, actor, "network", "policy_updated", "", ev)
	return h.info(ctx, sb)
}

func joinRules(rs []egress.Rule) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}

// Info returns a sandbox's policy, address, granted secrets and ports.
func (h *Service) Info(ctx context.Context, owner, id string) (*Info, error) {
	sb, err := h.core.Visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return h.info(ctx, sb)
}

func (h *Service) info(_ context.Context, sb *sandbox.Sandbox) (*Info, error) {
	pol, err := policyOf(sb)
	if err != nil {
		return nil, err
	}
	info := &Info{SandboxID: sb.ID, Policy: pol, Ports: portInfos(sb)}
	if h.net != nil {
		if att, ok := h.net.mgr.Get(sb.ID); ok {
			info.Attached, info.IP = true, att.IP.String()
		}
	}
	for _, r := range grantRefs(sb) {
		info.Secrets = append(info.Secrets, r.Name)
	}
	return info, nil
}

// EgressLog returns a sandbox's egress decisions after seq `after`, oldest
// first. It is kept after the sandbox is deleted only in the store.
func (h *Service) EgressLog(ctx context.Context, owner, id string, after int64, limit int) ([]store.EgressEntry, error) {
	if _, err := h.core.Visible(ctx, owner, id); err != nil {
		return nil, err
	}
	if after < 0 || limit < 0 {
		return nil, errs.Field("after", "after and limit must not be negative")
	}
	if h.net != nil {
		h.flushEgress(ctx)
	}
	return h.core.Store().ListEgress(ctx, store.EgressFilter{SandboxID: id, AfterSeq: after, Limit: limit})
}

// Inherit is what a fork inherits of its parent's network: the policy
// and the secret grants (whose placeholders are in the inherited env).
// Exposed ports and the namespace are not inherited.
func Inherit(parent *sandbox.Sandbox) sandbox.NetState {
	return sandbox.NetState{Policy: slices.Clone(parent.Net.Policy), Secrets: slices.Clone(parent.Net.Secrets),
		LeaseTTL: parent.Net.LeaseTTL}
}
