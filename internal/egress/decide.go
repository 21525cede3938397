package egress

import (
	"net/netip"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Query is one connection attempt as the proxy sees it.
type Query struct {
	IP   netip.Addr // original destination
	Port uint16
	Host string // TLS SNI or HTTP Host, "" if none was seen
}

// Verdict is the outcome of Decide.
type Verdict struct {
	Allow bool
	// Rule is the rule that decided, or "mode:allow-all", "mode:deny-all",
	// "default-deny".
	Rule string
	// ByName is set when a hostname rule allowed the connection: the proxy
	// then dials the name itself (resolving on the host) and ignores the
	// destination IP the sandbox chose, so a spoofed SNI gains nothing.
	ByName bool
}

// Decide applies a policy to one connection: deny rules first, then allow
// rules (hostname rules before IP rules), then the mode's default. It does
// not look at private ranges; the dialer does (see Policy.ipAllowed).
func Decide(p Policy, q Query) Verdict {
	host := normalizeHost(q.Host)
	if p.Mode == DenyAll {
		return Verdict{Rule: "mode:deny-all"}
	}
	for _, r := range p.Deny {
		if r.matchesHost(host, q.Port) || r.matchesIP(q.IP, q.Port) {
			return Verdict{Rule: "deny:" + r.String()}
		}
	}
	for _, r := range p.Allow {
		if r.matchesHost(host, q.Port) {
			return Verdict{Allow: true, Rule: "allow:" + r.String(), ByName: true}
		}
	}
	for _, r := range p.Allow {
		if r.matchesIP(q.IP, q.Port) {
			return Verdict{Allow: true, Rule: "allow:" + r.String()}
		}
	}
	if p.Mode == AllowAll {
		return Verdict{Allow: true, Rule: "mode:allow-all"}
	}
	return Verdict{Rule: "default-deny"}
}

// nameAllowed reports whether a hostname could be allowed by name (used by
// the resolver to decide which names it answers in full).
func (p Policy) nameAllowed(host string) (allowed, denied bool) {
	host = normalizeHost(host)
	if p.Mode == DenyAll {
		return false, true
	}
	for _, r := range p.Deny {
		if r.Port == 0 && r.matchesHost(host, 0) {
			return false, true
		}
	}
	if p.Mode == AllowAll {
		return true, false
	}
	for _, r := range p.Allow {
		if r.matchesHost(host, 0) {
			return true, false
		}
	}
	return false, false
}

// ipAllowed decides whether a concrete address may be dialled (or handed out
// by DNS) for a connection the policy already allowed by name, by rule or by
// mode: never an always-blocked address, never one a deny rule covers, and a
// private or link-local one only inside a range the server opened
// (allowPrivate, `berth serve --allow-private-egress`). A tenant's own rule
// never opens a private range.
func (p Policy) ipAllowed(ip netip.Addr, port uint16, allowPrivate []netip.Prefix) bool {
	ip = ip.Unmap()
	if alwaysBlocked(ip) {
		return false
	}
	for _, r := range p.Deny {
		if r.matchesIP(ip, port) {
			return false
		}
	}
	return !IsPrivate(ip) || inAny(allowPrivate, ip)
}

// CheckRanges refuses allow rules that name a private or link-local range
// the server has not opened (allowPrivate), or a range that is never
// reachable (loopback, multicast, ...). A rule wider than such a range (e.g.
// 0.0.0.0/0) is accepted: the addresses in it stay unreachable at dial time.
// The error names the field and the rule.
func CheckRanges(p Policy, allowPrivate []netip.Prefix) error {
	for _, r := range p.Allow {
		if r.Kind != RuleCIDR {
			continue
		}
		for _, b := range blockedPrefixes {
			if within(r.Prefix, b) {
				return errs.Field("allow", "%q is in %s, which no sandbox can reach", r.String(), b)
			}
		}
		for _, pp := range privatePrefixes {
			if within(r.Prefix, pp) && !coveredBy(r.Prefix, allowPrivate) {
				return errs.Field("allow", "%q is in the private or link-local range %s; a tenant rule cannot open it "+
					"(the operator can, with berth serve --allow-private-egress CIDR)", r.String(), pp)
			}
		}
	}
	return nil
}

// within reports whether prefix a lies entirely inside b.
func within(a, b netip.Prefix) bool {
	return a.Addr().BitLen() == b.Addr().BitLen() && a.Bits() >= b.Bits() && b.Contains(a.Addr())
}

func coveredBy(a netip.Prefix, ps []netip.Prefix) bool {
	for _, p := range ps {
		if within(a, p.Masked()) {
			return true
		}
	}
	return false
}

// matchesIP: a port-less rule matches any port; port 0 in a query (DNS)
// matches any rule port.
func (r Rule) matchesIP(ip netip.Addr, port uint16) bool {
	if r.Kind != RuleCIDR || !ip.IsValid() {
		return false
	}
	return r.portOK(port) && r.Prefix.Contains(ip.Unmap())
}

func (r Rule) matchesHost(host string, port uint16) bool {
	if host == "" || !r.portOK(port) {
		return false
	}
	switch r.Kind {
	case RuleHost:
		return host == r.Host
	case RuleWildcard:
		return strings.HasSuffix(host, "."+r.Host)
	}
	return false
}

func (r Rule) portOK(port uint16) bool { return r.Port == 0 || port == 0 || r.Port == port }

func normalizeHost(h string) string {
	h = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(h), "."))
	// An IP literal in SNI or Host is not a name: hostname rules never match it.
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return ""
	}
	return h
}

// privatePrefixes are the operator's networks: RFC 1918, CGNAT, ULA and
// link-local (cloud metadata lives at 169.254.169.254).
var privatePrefixes = mustPrefixes(
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
	"fc00::/7", "fec0::/10", "fe80::/10",
)

var blockedPrefixes = mustPrefixes(
	"0.0.0.0/8", "127.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "ff00::/8",
)

// PrivatePrefixes are the ranges no sandbox reaches, by rule or by name
// (DNS rebinding guard), unless the server opens them (Config.AllowPrivate).
func PrivatePrefixes() []netip.Prefix { return append([]netip.Prefix(nil), privatePrefixes...) }

// BlockedPrefixes are never reachable from a sandbox, whatever the policy
// or the server's settings: loopback, multicast, unspecified, reserved.
func BlockedPrefixes() []netip.Prefix { return append([]netip.Prefix(nil), blockedPrefixes...) }

// IsPrivate reports whether ip is in a private (RFC 1918, CGNAT, ULA) or
// link-local range.
func IsPrivate(ip netip.Addr) bool { return inAny(privatePrefixes, ip.Unmap()) }

func alwaysBlocked(ip netip.Addr) bool { return !ip.IsValid() || inAny(blockedPrefixes, ip) }

func inAny(ps []netip.Prefix, ip netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}
