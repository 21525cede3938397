package cli

import (
	"net/netip"
	"testing"
)

func TestDeriveNetwork(t *testing.T) {
	var def NetworkServeConfig
	deriveNetwork(defaultDataDir, &def)
	if def != (NetworkServeConfig{}) {
		t.Fatalf("the default data dir must keep the default network names, got %+v", def)
	}
	var a, a2, b NetworkServeConfig
	deriveNetwork("/tmp/b1", &a)
	deriveNetwork("/tmp/b1/", &a2)
	deriveNetwork("/tmp/b2", &b)
	if a != a2 {
		t.Errorf("not stable for one data dir: %+v vs %+v", a, a2)
	}
	if a.Bridge == b.Bridge || a.Table == b.Table || a.Subnet == b.Subnet {
		t.Errorf("two data dirs share network names: %+v vs %+v", a, b)
	}
	if len(a.Bridge) > 15 || len(a.VethPrefix) > 4 || a.Bridge == "berth0" || a.Table == "berth" {
		t.Errorf("bad derived names: %+v", a)
	}
	if p, err := netip.ParsePrefix(a.Subnet); err != nil || p.Bits() != 24 || p.Overlaps(netip.MustParsePrefix("10.88.0.0/16")) {
		t.Errorf("derived subnet %q", a.Subnet)
	}
	explicit := NetworkServeConfig{Bridge: "mine", Subnet: "10.99.0.0/16"}
	deriveNetwork("/tmp/b1", &explicit)
	if explicit.Bridge != "mine" || explicit.Subnet != "10.99.0.0/16" || explicit.Table == "" {
		t.Errorf("explicit settings must win: %+v", explicit)
	}
}
