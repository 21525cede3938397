package network

import (
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkDelta measures the ruleset part of an attach alone: one
// sandbox's attach delta sent over netlink beside N others (its detach
// delta outside the clock). Compare BenchmarkAttach, which adds the
// namespace, the veth and their addresses.
func BenchmarkDelta(b *testing.B) {
	envSubnetBits = 20
	defer func() { envSubnetBits = 24 }()
	e := newEnv(b)
	have := 0
	for _, n := range []int{0, 100, 1000} {
		seedRuleset(b, e.mgr, have, n)
		have = n
		sb := SandboxNet{ID: "benchdelta", IP: netip.MustParseAddr(lastAddr(e.mgr.cfg.Subnet).Prev().String()),
			Veth: e.mgr.vethName("benchdelta"), Policy: policy(b, "rules", []string{goodIP, "good.test"}, nil)}
		b.Run(fmt.Sprintf("others=%d", n), func(b *testing.B) {
			for b.Loop() {
				must(b, applyDeltas(e.mgr.plan, []delta{{opAttach, sb}}))
				b.StopTimer()
				must(b, applyDeltas(e.mgr.plan, []delta{{opDetach, sb}}))
				b.StartTimer()
			}
		})
	}
}
