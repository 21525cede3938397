// Package egress enforces a sandbox's network policy in user space: a
// transparent TCP proxy that peeks TLS SNI / HTTP Host, decides, and splices
// or intercepts (to inject granted credentials), plus a DNS resolver that
// answers from the host's resolver and refuses rebinding to private ranges.
// internal/network steers every packet of a sandbox to it with nftables.
package egress

import (
	"encoding/json"
	"net/netip"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Mode is a policy's default.
type Mode string

const (
	DenyAll  Mode = "deny-all"  // no egress at all; rules are not allowed
	AllowAll Mode = "allow-all" // everything public; Deny rules still apply
	Rules    Mode = "rules"     // default deny; Allow and Deny rules apply
)

// RuleKind says what a rule matches on.
type RuleKind int

const (
	RuleCIDR     RuleKind = iota + 1 // an IP or a CIDR
	RuleHost                         // an exact hostname
	RuleWildcard                     // "*.domain": any name below domain (not domain itself)
)

// Rule is one allow or deny entry: a CIDR, an IP, a hostname or "*.domain",
// optionally restricted to one port. Its text form is what ParseRule reads.
type Rule struct {
	Kind   RuleKind
	Prefix netip.Prefix // RuleCIDR
	Host   string       // RuleHost: the name; RuleWildcard: the domain without "*."
	Port   uint16       // 0 = any port
}

// Policy is a sandbox's egress policy. The JSON form is
// {"mode":"rules","allow":["api.github.com:443"],"deny":["10.0.0.0/8"]}.
type Policy struct {
	Mode  Mode   `json:"mode"`
	Allow []Rule `json:"allow,omitempty"`
	Deny  []Rule `json:"deny,omitempty"`
	// Effects marks the side effects the ledger records (effects.go).
	Effects EffectPolicy `json:"effects,omitzero"`
}

// ParseRule reads RULE: a CIDR, an IP, a hostname or "*.domain", optionally
// followed by ":PORT". IPv6 addresses with a port are written "[::1]:443".
// A malformed rule is an InvalidArgument error that names it.
func ParseRule(s string) (Rule, error) {
	bad := func(format string, args ...any) (Rule, error) {
		return Rule{}, errs.Field("rule", "%q: "+format, append([]any{s}, args...)...)
	}
	in := strings.TrimSpace(s)
	if in == "" {
		return bad("empty rule; want a CIDR, an IP, a hostname or *.domain, optionally :PORT")
	}
	host, port := in, uint16(0)
	if strings.HasPrefix(in, "[") {
		end := strings.Index(in, "]")
		if end < 0 {
			return bad("missing ']'")
		}
		host = in[1:end]
		rest := in[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return bad("unexpected %q after ']'", rest)
			}
			p, err := parsePort(rest[1:])
			if err != nil {
				return bad("%v", err)
			}
			port = p
		}
	} else if strings.Count(in, ":") == 1 {
		i := strings.LastIndex(in, ":")
		p, err := parsePort(in[i+1:])
		if err != nil {
			return bad("%v", err)
		}
		host, port = in[:i], p
	}
	if strings.Contains(host, "/") {
		pfx, err := netip.ParsePrefix(host)
		if err != nil {
			return bad("invalid CIDR: %v", err)
		}
		return Rule{Kind: RuleCIDR, Prefix: pfx.Masked(), Port: port}, nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return bad("zones are not allowed")
		}
		ip = ip.Unmap()
		return Rule{Kind: RuleCIDR, Prefix: netip.PrefixFrom(ip, ip.BitLen()), Port: port}, nil
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	kind := RuleHost
	if strings.HasPrefix(name, "*.") {
		kind, name = RuleWildcard, name[2:]
	}
	if err := validHostname(name); err != nil {
		return bad("%v", err)
	}
	if _, err := netip.ParseAddr(name); err == nil && kind == RuleHost {
		// "1.2.3.4." is neither a name (hostname rules never match an IP
		// literal) nor, as written, an address.
		return bad("an IP address with a trailing dot; write it without")
	}
	return Rule{Kind: kind, Host: name, Port: port}, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, errs.E(errs.InvalidArgument, "port must be 1-65535, got %q", s)
	}
	return uint16(n), nil
}

func validHostname(name string) error {
	if name == "" || len(name) > 253 {
		return errs.E(errs.InvalidArgument, "hostname must be 1-253 characters")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return errs.E(errs.InvalidArgument, "hostname labels must be 1-63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return errs.E(errs.InvalidArgument, "hostname label %q starts or ends with '-'", label)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return errs.E(errs.InvalidArgument, "hostname has invalid character %q (wildcards only as a leading \"*.\")", c)
			}
		}
	}
	return nil
}

// String is the canonical text form, which ParseRule reads back.
func (r Rule) String() string {
	var h string
	switch r.Kind {
	case RuleCIDR:
		if r.Prefix.IsSingleIP() {
			h = r.Prefix.Addr().String()
		} else {
			h = r.Prefix.String()
		}
		if r.Port != 0 && r.Prefix.Addr().Is6() {
			return "[" + h + "]:" + strconv.Itoa(int(r.Port))
		}
	case RuleHost:
		h = r.Host
	case RuleWildcard:
		h = "*." + r.Host
	default:
		return "<invalid>"
	}
	if r.Port != 0 {
		h += ":" + strconv.Itoa(int(r.Port))
	}
	return h
}

// MarshalText implements encoding.TextMarshaler.
func (r Rule) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *Rule) UnmarshalText(b []byte) error {
	p, err := ParseRule(string(b))
	if err != nil {
		return err
	}
	*r = p
	return nil
}

// ParsePolicy builds a Policy from a mode and rule strings, as a CLI would
// (e.g. `--network rules --allow api.github.com:443`). An empty mode means
// deny-all without rules and rules with them.
func ParsePolicy(mode string, allow, deny []string) (Policy, error) {
	p := Policy{Mode: Mode(mode)}
	if p.Mode == "" {
		p.Mode = DenyAll
		if len(allow)+len(deny) > 0 {
			p.Mode = Rules
		}
	}
	for _, s := range allow {
		r, err := ParseRule(s)
		if err != nil {
			return Policy{}, err
		}
		p.Allow = append(p.Allow, r)
	}
	for _, s := range deny {
		r, err := ParseRule(s)
		if err != nil {
			return Policy{}, err
		}
		p.Deny = append(p.Deny, r)
	}
	return p, p.Validate()
}

// Validate checks the mode and that every rule is well formed.
func (p Policy) Validate() error {
	switch p.Mode {
	case DenyAll:
		if len(p.Allow)+len(p.Deny) > 0 {
			return errs.Field("network.mode", "deny-all takes no rules; use mode \"rules\"")
		}
	case AllowAll, Rules:
	default:
		return errs.Field("network.mode", "%q is not one of deny-all, allow-all, rules", p.Mode)
	}
	for _, rs := range [][]Rule{p.Allow, p.Deny} {
		for _, r := range rs {
			if r.Kind < RuleCIDR || r.Kind > RuleWildcard || (r.Kind == RuleCIDR && !r.Prefix.IsValid()) {
				return errs.Field("rule", "%q: malformed rule", r.String())
			}
		}
	}
	return p.Effects.Validate()
}

// MarshalPolicy is the persisted form of a policy (JSON).
func MarshalPolicy(p Policy) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(p)
}

// UnmarshalPolicy reads what MarshalPolicy wrote; empty input is deny-all.
func UnmarshalPolicy(b []byte) (Policy, error) {
	if len(b) == 0 {
		return Policy{Mode: DenyAll}, nil
	}
	var p Policy
	if err := json.Unmarshal(b, &p); err != nil {
		if errs.KindOf(err) == errs.InvalidArgument {
			return Policy{}, err
		}
		return Policy{}, errs.Wrap(errs.InvalidArgument, err, "network policy")
	}
	// One form for "no rules", so a policy compares equal to its round trip.
	if len(p.Allow) == 0 {
		p.Allow = nil
	}
	if len(p.Deny) == 0 {
		p.Deny = nil
	}
	if len(p.Effects.Hosts) == 0 {
		p.Effects.Hosts = nil
	}
	return p, p.Validate()
}
