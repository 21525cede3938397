package network

import (
	"context"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite golden files")

func testPlanConfig() PlanConfig {
	return PlanConfig{Table: "berth", Bridge: "berth0", VethPrefix: "bv",
		Subnet: netip.MustParsePrefix("10.88.0.0/16"), Gateway: netip.MustParseAddr("10.88.0.1"),
		ProxyPort: 15001, DNSPort: 53}
}

func policy(t testing.TB, mode string, allow, deny []string) egress.Policy {
	t.Helper()
	p, err := egress.ParsePolicy(mode, allow, deny)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPlanGolden(t *testing.T) {
	tests := []struct {
		name string
		sbs  []SandboxNet
		open []netip.Prefix // PlanConfig.OpenPrivate
	}{
		{"empty", nil, nil},
		{"deny-all", []SandboxNet{{ID: "a1", IP: netip.MustParseAddr("10.88.0.2"), Veth: "bva1", Policy: egress.Policy{Mode: egress.DenyAll}}}, nil},
		{"allow-all", []SandboxNet{{ID: "a1", IP: netip.MustParseAddr("10.88.0.2"), Veth: "bva1",
			Policy: policy(t, "allow-all", nil, []string{"198.51.100.0/24:53", "*.evil.test"})}}, nil},
		{"rules", []SandboxNet{
			{ID: "zz9", IP: netip.MustParseAddr("10.88.0.3"), Veth: "bvzz9", Policy: policy(t, "rules",
				[]string{"api.github.com:443", "*.pypi.org", "203.0.113.0/24", "198.51.100.7:123", "2001:db8::/32"},
				[]string{"203.0.113.66"})},
			{ID: "a1", IP: netip.MustParseAddr("10.88.0.2"), Veth: "bva1", Policy: egress.Policy{Mode: egress.DenyAll}},
		}, nil},
		// The operator opened one private range; the tenant names part of it.
		{"open-private", []SandboxNet{{ID: "a1", IP: netip.MustParseAddr("10.88.0.2"), Veth: "bva1",
			Policy: policy(t, "rules", []string{"192.168.50.0/24:5432"}, nil)}},
			[]netip.Prefix{netip.MustParsePrefix("192.168.50.0/24"), netip.MustParsePrefix("fd00::/8")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testPlanConfig()
			cfg.OpenPrivate = tc.open
			got, err := Plan(cfg, tc.sbs)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.name+".nft")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("ruleset differs from %s (-want +got; rerun with -update)\n%s", path, diff)
			}
			// The kernel's parser is the real judge of the text: check it
			// without committing (nft -c needs CAP_NET_ADMIN).
			if os.Geteuid() == 0 || testutil.CI() {
				testutil.RequireRoot(t)
				testutil.RequireTool(t, "nft")
				cmd := exec.CommandContext(context.Background(), "nft", "-c", "-f", path)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("nft -c rejects %s: %v\n%s", path, err, out)
				}
			}
		})
	}
}

func TestPlanRejects(t *testing.T) {
	good := SandboxNet{ID: "a1", IP: netip.MustParseAddr("10.88.0.2"), Veth: "bva1", Policy: egress.Policy{Mode: egress.DenyAll}}
	tests := []struct {
		name string
		cfg  func(*PlanConfig)
		sb   func(*SandboxNet)
	}{
		{"ip outside subnet", nil, func(s *SandboxNet) { s.IP = netip.MustParseAddr("10.89.0.2") }},
		{"bad id", nil, func(s *SandboxNet) { s.ID = "a; flush ruleset" }},
		{"veth prefix", nil, func(s *SandboxNet) { s.Veth = "eth9" }},
		{"bad mode", nil, func(s *SandboxNet) { s.Policy.Mode = "open" }},
		{"bad table", func(c *PlanConfig) { c.Table = "x y" }, nil},
		{"veth prefix of bridge", func(c *PlanConfig) { c.VethPrefix = "ber" }, nil},
		{"gateway outside", func(c *PlanConfig) { c.Gateway = netip.MustParseAddr("10.0.0.1") }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, sb := testPlanConfig(), good
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			if tc.sb != nil {
				tc.sb(&sb)
			}
			if _, err := Plan(cfg, []SandboxNet{sb}); !errs.Is(err, errs.InvalidArgument) {
				t.Errorf("Plan = %v, want InvalidArgument", err)
			}
		})
	}
}
