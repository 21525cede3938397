package network

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/berth-dev/berth/internal/egress"
)

// A sandbox attached again in a fresh namespace (a runsc memory restore,
// a rewind) answers the host's dials to its ports at once: its eth0 has
// the MAC it had, and a neighbour entry the host kept for its address is
// not trusted. Before, eth0 got a random MAC, the host's "reachable" entry
// named the old one, and a dial went unanswered until the entry expired
// (15–45 s); the E2B suite's runsc memory pause + connect timed out on it.
func TestReattachedSandboxAnswersTheHostAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pol := egress.Policy{Mode: egress.DenyAll}
	// A neighbour keeps a port on the bridge: with its last port gone the
	// bridge loses carrier and Linux drops every neighbour entry on it.
	e.attach("arp0", pol)
	const id = "arp1"
	att := e.attach(id, pol)
	mac := e.eth0MAC(id)
	e.dialIn(id, att.IP) // the host now has a reachable entry for att.IP

	must(t, e.mgr.Detach(ctx, id))
	again := e.attach(id, pol)
	if again.IP != att.IP {
		t.Fatalf("re-attached at %s, had %s", again.IP, att.IP)
	}
	if got := e.eth0MAC(id); !bytes.Equal(got, mac) {
		t.Errorf("eth0's MAC is %s after the re-attach, was %s", got, mac)
	}
	e.dialIn(id, att.IP)

	// An entry naming a MAC nobody has (another sandbox's, from before)
	// is dropped when the address is attached.
	must(t, e.mgr.Detach(ctx, id))
	br, err := netlink.LinkByName(e.mgr.Config().BridgeName)
	must(t, err)
	must(t, netlink.NeighSet(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_REACHABLE, IP: att.IP.AsSlice(), HardwareAddr: net.HardwareAddr{0x02, 0, 0, 0, 0xde, 0xad}}))
	e.attach(id, pol)
	e.dialIn(id, att.IP)
	must(t, e.mgr.Detach(ctx, id))
	must(t, e.mgr.Detach(ctx, "arp0"))
}

func (e *env) eth0MAC(id string) net.HardwareAddr {
	e.t.Helper()
	var mac net.HardwareAddr
	must(e.t, inNetns(e.mgr.netnsPath(id), func() error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			mac = l.Attrs().HardwareAddr
		}
		return err
	}))
	return mac
}

// dialIn listens on a TCP port inside the sandbox's namespace and dials
// it from the host, as the daemon's port routing does, within 3 s.
func (e *env) dialIn(id string, ip netip.Addr) {
	e.t.Helper()
	var ln net.Listener
	must(e.t, inNetns(e.mgr.netnsPath(id), func() (err error) {
		ln, err = net.Listen("tcp4", ":7070")
		return err
	}))
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("here"))
		_ = c.Close()
	}()
	d := net.Dialer{Timeout: 3 * time.Second}
	c, err := d.Dial("tcp4", net.JoinHostPort(ip.String(), "7070"))
	if err != nil {
		e.t.Fatalf("dial %s's port from the host: %v", id, err)
	}
	b, _ := io.ReadAll(c)
	_ = c.Close()
	if string(b) != "here" {
		e.t.Errorf("read %q from %s's port", b, id)
	}
	<-served
}
