//go:build linux && !clientonly

package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

func TestDeriveNetwork(t *testing.T) {
	var def NetworkServeConfig
	deriveNetwork(defaultDataDir, &def)
	if !reflect.DeepEqual(def, NetworkServeConfig{}) {
		t.Fatalf("the default data dir must keep the default network names, got %+v", def)
	}
	var a, a2, b NetworkServeConfig
	deriveNetwork("/tmp/b1", &a)
	deriveNetwork("/tmp/b1/", &a2)
	deriveNetwork("/tmp/b2", &b)
	if !reflect.DeepEqual(a, a2) {
		t.Errorf("not stable for one data dir: %+v vs %+v", a, a2)
	}
	if a.Bridge == b.Bridge || a.Table == b.Table || a.Subnet == b.Subnet {
		t.Errorf("two data dirs share network names: %+v vs %+v", a, b)
	}
	if len(a.Bridge) > 15 || len(a.VethPrefix) > 4 || a.Bridge == "berth0" || a.Table == "berth" {
		t.Errorf("bad derived names: %+v", a)
	}
	if p, err := netip.ParsePrefix(a.Subnet); err != nil || p.Bits() != 22 || p.Overlaps(netip.MustParsePrefix("10.88.0.0/16")) {
		t.Errorf("derived subnet %q", a.Subnet)
	}
	explicit := NetworkServeConfig{Bridge: "mine", Subnet: "10.99.0.0/16"}
	deriveNetwork("/tmp/b1", &explicit)
	if explicit.Bridge != "mine" || explicit.Subnet != "10.99.0.0/16" || explicit.Table == "" {
		t.Errorf("explicit settings must win: %+v", explicit)
	}
}

// A data dir whose server ran before keeps the layout it used, even when
// the derivation would now pick another subnet (its own bridge, kept by
// running sandboxes, occupies the derived one after a restart).
func TestDeriveNetworkTakesOverSavedLayout(t *testing.T) {
	dir := t.TempDir()
	saved := `{"bridge":"bbsaved","subnet":"10.203.7.0/24","table":"berth_saved","veth_prefix":"vsav"}`
	if err := os.MkdirAll(filepath.Join(dir, "network"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "network", "layout.json"), []byte(saved), 0o600); err != nil {
		t.Fatal(err)
	}
	var c NetworkServeConfig
	deriveNetwork(dir, &c)
	want := NetworkServeConfig{Bridge: "bbsaved", Subnet: "10.203.7.0/24", Table: "berth_saved", VethPrefix: "vsav"}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("derived %+v, want the saved layout %+v", c, want)
	}
	explicit := NetworkServeConfig{Subnet: "10.99.0.0/16"}
	deriveNetwork(dir, &explicit)
	if explicit.Subnet != "10.99.0.0/16" || explicit.Bridge != "bbsaved" {
		t.Errorf("explicit settings must win over the saved layout: %+v", explicit)
	}
}

func TestValidateAllowPrivateEgress(t *testing.T) {
	for _, tc := range []struct {
		cidrs []string
		bad   string
	}{
		{[]string{"10.20.0.0/16", "169.254.169.254/32", "fd00::/8"}, ""},
		{[]string{"8.8.8.0/24"}, "8.8.8.0/24"},   // public: nothing to open
		{[]string{"0.0.0.0/0"}, "0.0.0.0/0"},     // wider than any private range
		{[]string{"127.0.0.0/8"}, "127.0.0.0/8"}, // loopback stays closed
		{[]string{"10.0.0.0/33"}, "10.0.0.0/33"},
	} {
		c := NetworkServeConfig{AllowPrivateEgress: tc.cidrs}
		err := c.Validate()
		if tc.bad == "" {
			if err != nil {
				t.Errorf("Validate(%v) = %v", tc.cidrs, err)
			}
			continue
		}
		if errs.FieldOf(err) != "allow_private_egress" || !strings.Contains(err.Error(), tc.bad) {
			t.Errorf("Validate(%v) = %v, want an allow_private_egress error naming %s", tc.cidrs, err, tc.bad)
		}
	}
}
