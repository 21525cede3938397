package network

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/berth-dev/berth/internal/egress"
)

// TestBridgeKeepsItsAddress: the gateway's MAC does not move when a
// sandbox detaches (a delete, a pause, a runsc rewind's re-attachment).
// Sandbox a holds the lowest port address; before the bridge had an
// address of its own, a's detach moved the bridge's to b's port and b's
// neighbour entry for the gateway pointed at nothing: b lost DNS and the
// proxy until the entry expired.
func TestBridgeKeepsItsAddress(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := e.mgr.Config().BridgeName
	bridgeAddr := func() net.HardwareAddr {
		t.Helper()
		l, err := netlink.LinkByName(name)
		must(t, err)
		return l.Attrs().HardwareAddr
	}
	want := bridgeMAC(name)
	if got := bridgeAddr(); !bytes.Equal(got, want) || !addrSet(name) {
		t.Fatalf("bridge %s has address %s (set: %v), want its own %s", name, got, addrSet(name), want)
	}
	e.attach("brmaca", egress.Policy{Mode: egress.AllowAll})
	sh(t, "ip", "link", "set", "dev", e.mgr.vethName("brmaca"), "address", "02:00:00:00:00:01")
	e.attach("brmacb", egress.Policy{Mode: egress.AllowAll})
	resolve := func(when string) {
		t.Helper()
		out, code := e.inSandbox("brmacb", nil, "timeout", "4", "getent", "hosts", "good.test")
		if code != 0 || !strings.Contains(out, goodIP) {
			t.Fatalf("%s: b resolves good.test: exit %d %q", when, code, out)
		}
	}
	resolve("before a's detach")
	if got := bridgeAddr(); !bytes.Equal(got, want) {
		t.Fatalf("with a port of a lower address the bridge took %s, want %s", got, want)
	}
	must(t, e.mgr.Detach(ctx, "brmaca"))
	if got := bridgeAddr(); !bytes.Equal(got, want) {
		t.Fatalf("after a's detach the bridge's address is %s, want %s", got, want)
	}
	resolve("after a's detach")
	must(t, e.mgr.Detach(ctx, "brmacb"))

	// A server started again over the bridge keeps the address.
	m2, err := New(e.mgr.Config())
	must(t, err)
	must(t, m2.Setup(ctx))
	e.mgr = m2
	if got := bridgeAddr(); !bytes.Equal(got, want) || !addrSet(name) {
		t.Fatalf("after a second setup the bridge has %s (set: %v), want %s", got, addrSet(name), want)
	}
}
