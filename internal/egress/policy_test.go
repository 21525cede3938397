package egress

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
)

func TestParseRule(t *testing.T) {
	tests := []struct {
		in   string
		want Rule
		str  string
	}{
		{"10.0.0.0/8", Rule{Kind: RuleCIDR, Prefix: netip.MustParsePrefix("10.0.0.0/8")}, "10.0.0.0/8"},
		{"10.1.2.3/8:443", Rule{Kind: RuleCIDR, Prefix: netip.MustParsePrefix("10.0.0.0/8"), Port: 443}, "10.0.0.0/8:443"},
		{"1.2.3.4", Rule{Kind: RuleCIDR, Prefix: netip.MustParsePrefix("1.2.3.4/32")}, "1.2.3.4"},
		{"1.2.3.4:22", Rule{Kind: RuleCIDR, Prefix: netip.MustParsePrefix("1.2.3.4/32"), Port: 22}, "1.2.3.4:22"},
		{"2001:db8::/32", Rule{Kind: RuleCIDR, Prefix: netip.MustParsePrefix("2001:db8::/32")}, "2001:db8::/32"},
		{"[2001:db8::1]:443", Rule{Kind: RuleCIDR, Prefix: netip.MustParsePrefix("2001:db8::1/128"), Port: 443}, "[2001:db8::1]:443"},
		{"API.GitHub.com.", Rule{Kind: RuleHost, Host: "api.github.com"}, "api.github.com"},
		{"api.github.com:443", Rule{Kind: RuleHost, Host: "api.github.com", Port: 443}, "api.github.com:443"},
		{"*.example.com", Rule{Kind: RuleWildcard, Host: "example.com"}, "*.example.com"},
		{"*.example.com:8443", Rule{Kind: RuleWildcard, Host: "example.com", Port: 8443}, "*.example.com:8443"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRule(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			if got.String() != tc.str {
				t.Errorf("String() = %q, want %q", got.String(), tc.str)
			}
			back, err := ParseRule(got.String())
			if err != nil || back != got {
				t.Errorf("round trip: %v %v", back, err)
			}
		})
	}
}

func TestParseRuleInvalid(t *testing.T) {
	for _, in := range []string{
		"", "example.com:0", "example.com:70000", "example.com:http", "10.0.0.0/33",
		"exa mple.com", "*.", "foo.*.com", "-bad.com", "a..b", "[::1", "[::1]x", "fe80::1%eth0",
		"ex*ample.com", "http://example.com",
	} {
		t.Run(in, func(t *testing.T) {
			_, err := ParseRule(in)
			if !errs.Is(err, errs.InvalidArgument) {
				t.Fatalf("ParseRule(%q) = %v, want InvalidArgument", in, err)
			}
			if errs.FieldOf(err) != "rule" {
				t.Errorf("field = %q, want rule", errs.FieldOf(err))
			}
		})
	}
}

func mustPolicy(t *testing.T, mode Mode, allow, deny []string) Policy {
	t.Helper()
	p, err := ParsePolicy(string(mode), allow, deny)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecide(t *testing.T) {
	pub := netip.MustParseAddr("203.0.113.10")
	rules := mustPolicy(t, Rules,
		[]string{"api.example.com:443", "*.cdn.test", "198.51.100.0/24", "203.0.113.99:22"},
		[]string{"bad.cdn.test", "198.51.100.66"})
	tests := []struct {
		name string
		pol  Policy
		q    Query
		want Verdict
	}{
		{"deny-all", Policy{Mode: DenyAll}, Query{IP: pub, Port: 443, Host: "api.example.com"}, Verdict{Rule: "mode:deny-all"}},
		{"allow-all", Policy{Mode: AllowAll}, Query{IP: pub, Port: 443}, Verdict{Allow: true, Rule: "mode:allow-all"}},
		{"host exact", rules, Query{IP: pub, Port: 443, Host: "API.example.com"}, Verdict{Allow: true, Rule: "allow:api.example.com:443", ByName: true}},
		{"host wrong port", rules, Query{IP: pub, Port: 80, Host: "api.example.com"}, Verdict{Rule: "default-deny"}},
		{"ip literal of allowed host", rules, Query{IP: pub, Port: 443, Host: "203.0.113.10"}, Verdict{Rule: "default-deny"}},
		{"no sni", rules, Query{IP: pub, Port: 443}, Verdict{Rule: "default-deny"}},
		{"wildcard", rules, Query{IP: pub, Port: 443, Host: "a.b.cdn.test"}, Verdict{Allow: true, Rule: "allow:*.cdn.test", ByName: true}},
		{"wildcard not apex", rules, Query{IP: pub, Port: 443, Host: "cdn.test"}, Verdict{Rule: "default-deny"}},
		{"deny host beats wildcard", rules, Query{IP: pub, Port: 443, Host: "bad.cdn.test"}, Verdict{Rule: "deny:bad.cdn.test"}},
		{"cidr", rules, Query{IP: netip.MustParseAddr("198.51.100.7"), Port: 5432}, Verdict{Allow: true, Rule: "allow:198.51.100.0/24"}},
		{"deny ip beats cidr", rules, Query{IP: netip.MustParseAddr("198.51.100.66"), Port: 5432}, Verdict{Rule: "deny:198.51.100.66"}},
		{"ip port", rules, Query{IP: netip.MustParseAddr("203.0.113.99"), Port: 22}, Verdict{Allow: true, Rule: "allow:203.0.113.99:22"}},
		{"ip other port", rules, Query{IP: netip.MustParseAddr("203.0.113.99"), Port: 23}, Verdict{Rule: "default-deny"}},
		{"allow-all deny", mustPolicy(t, AllowAll, nil, []string{"*.evil.test"}), Query{IP: pub, Port: 443, Host: "x.evil.test"}, Verdict{Rule: "deny:*.evil.test"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Decide(tc.pol, tc.q)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestIPAllowed(t *testing.T) {
	// A tenant's CIDR rule for a private range does not open it; only the
	// server's AllowPrivate does.
	pol := mustPolicy(t, Rules, []string{"example.test", "192.168.7.0/24"}, []string{"203.0.113.5", "10.9.9.9"})
	open := []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16"), netip.MustParsePrefix("169.254.169.254/32")}
	tests := []struct {
		ip               string
		closed, withOpen bool
	}{
		{"203.0.113.10", true, true},
		{"203.0.113.5", false, false}, // deny rule
		{"10.1.2.3", false, false},
		{"10.9.1.2", false, true},
		{"10.9.9.9", false, false}, // deny rule beats the server's opening
		{"192.168.7.9", false, false},
		{"127.0.0.1", false, false},
		{"169.254.169.254", false, true},
		{"169.254.1.1", false, false},
		{"fe80::1", false, false},
	}
	for _, tc := range tests {
		ip := netip.MustParseAddr(tc.ip)
		if got := pol.ipAllowed(ip, 443, nil); got != tc.closed {
			t.Errorf("ipAllowed(%s, nil) = %v, want %v", tc.ip, got, tc.closed)
		}
		if got := pol.ipAllowed(ip, 443, open); got != tc.withOpen {
			t.Errorf("ipAllowed(%s, %v) = %v, want %v", tc.ip, open, got, tc.withOpen)
		}
	}
}

func TestCheckRanges(t *testing.T) {
	open := []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}
	tests := []struct {
		allow []string
		bad   string // "" = accepted
	}{
		{[]string{"203.0.113.0/24", "example.test", "*.example.test:443"}, ""},
		{[]string{"0.0.0.0/0"}, ""},            // wider than any private range: private parts stay closed at dial time
		{[]string{"10.9.1.0/24:5432"}, ""},     // inside the server's opening
		{[]string{"10.0.0.0/8"}, "10.0.0.0/8"}, // wider than the opening
		{[]string{"192.168.1.10"}, "192.168.1.10"},
		{[]string{"169.254.169.254"}, "169.254.169.254"},
		{[]string{"100.64.0.0/16"}, "100.64.0.0/16"},
		{[]string{"fd00::/8"}, "fd00::/8"},
		{[]string{"127.0.0.1"}, "127.0.0.1"},
	}
	for _, tc := range tests {
		pol := mustPolicy(t, Rules, tc.allow, []string{"10.0.0.0/8"}) // deny rules may name anything
		err := CheckRanges(pol, open)
		if tc.bad == "" {
			if err != nil {
				t.Errorf("CheckRanges(%v) = %v, want nil", tc.allow, err)
			}
			continue
		}
		if !errs.Is(err, errs.InvalidArgument) || errs.FieldOf(err) != "allow" || !strings.Contains(err.Error(), tc.bad) {
			t.Errorf("CheckRanges(%v) = %v (field %q), want InvalidArgument on field allow naming %s", tc.allow, err, errs.FieldOf(err), tc.bad)
		}
	}
}

func TestPolicyMarshalRoundTrip(t *testing.T) {
	p := mustPolicy(t, Rules, []string{"api.github.com:443", "*.pypi.org", "10.0.0.0/8"}, []string{"1.2.3.4"})
	b, err := MarshalPolicy(p)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"mode":"rules","allow":["api.github.com:443","*.pypi.org","10.0.0.0/8"],"deny":["1.2.3.4"]}`
	if string(b) != want {
		t.Errorf("marshal = %s\nwant      %s", b, want)
	}
	got, err := UnmarshalPolicy(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	if _, err := UnmarshalPolicy([]byte(`{"mode":"rules","allow":["bad rule!"]}`)); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("bad rule: %v, want InvalidArgument", err)
	}
	if _, err := UnmarshalPolicy([]byte(`{"mode":"open"}`)); errs.FieldOf(err) != "network.mode" {
		t.Errorf("bad mode: %v, want field network.mode", err)
	}
	if _, err := ParsePolicy("deny-all", []string{"x.test"}, nil); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("deny-all with rules: %v", err)
	}
}
