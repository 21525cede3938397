package network

import (
	"context"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/berth-dev/berth/internal/egress"
)

// TestBeginFinishAbort: Begin takes the address and makes a namespace
// that holds a loopback device and nothing else (no veth, no address, no
// ruleset element), which Get does not show; Abort removes it and frees
// the address; Begin then Finish is an attach; a Finish that fails (a
// link of the veth's name already on the host) leaves nothing of either
// half, and the same sandbox attaches afterwards.
func TestBeginFinishAbort(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pol := egress.Policy{Mode: egress.AllowAll}

	p, err := e.mgr.Begin(ctx, "pend1", pol)
	must(t, err)
	if _, ok := e.mgr.Get("pend1"); ok {
		t.Error("Get shows an attachment that has only begun")
	}
	links := func(nsPath string) string {
		out, err := runOut("nsenter", "--net="+nsPath, "ip", "-o", "link")
		if err != nil {
			t.Fatalf("links in %s: %v %s", nsPath, err, out)
		}
		return out
	}
	in := links(p.NetNSPath())
	if strings.Count(strings.TrimSpace(in), "\n") != 0 || !strings.Contains(in, "lo:") || strings.Contains(in, "UP") {
		t.Errorf("a begun namespace holds more than a loopback device that is down:\n%s", in)
	}
	veth := e.mgr.vethName("pend1")
	if _, err := netlink.LinkByName(veth); err == nil {
		t.Errorf("veth %s exists before Finish", veth)
	}
	if rs, _ := runOut("nft", "list", "map", "bridge", e.mgr.Config().Table, "ports"); strings.Contains(rs, veth) {
		t.Errorf("the ruleset names %s before Finish:\n%s", veth, rs)
	}
	ip := p.r.IP
	must(t, p.Abort(ctx))
	assertGone(t, p.NetNSPath(), veth)
	e.mgr.mu.Lock()
	_, kept := e.mgr.sbs["pend1"]
	e.mgr.mu.Unlock()
	if kept {
		t.Error("Abort left the record")
	}

	p, err = e.mgr.Begin(ctx, "pend1", pol)
	must(t, err)
	if p.r.IP != ip {
		t.Logf("the aborted address %s was not handed out again (got %s)", ip, p.r.IP)
	}
	att, err := p.Finish(ctx)
	must(t, err)
	if got, ok := e.mgr.Get("pend1"); !ok || got.IP != att.IP || got.NetNSPath != p.NetNSPath() {
		t.Errorf("after Finish Get = %+v, %v; want %+v", got, ok, att)
	}
	if rs, _ := runOut("nft", "list", "map", "bridge", e.mgr.Config().Table, "ports"); !strings.Contains(rs, veth) {
		t.Errorf("the ruleset does not name %s after Finish:\n%s", veth, rs)
	}
	must(t, e.mgr.Detach(ctx, "pend1"))
	assertGone(t, att.NetNSPath, veth)

	// A Finish that fails unwinds Begin's half too.
	p, err = e.mgr.Begin(ctx, "pend2", pol)
	must(t, err)
	veth2 := e.mgr.vethName("pend2")
	must(t, netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: veth2}}))
	if _, err := p.Finish(ctx); err == nil {
		t.Fatal("Finish with the veth's name taken succeeded")
	}
	if l, err := netlink.LinkByName(veth2); err == nil {
		must(t, netlink.LinkDel(l))
	}
	assertGone(t, p.NetNSPath(), "")
	must(t, p.Abort(ctx)) // nothing left to undo
	e.attach("pend2", pol)
	must(t, e.mgr.Detach(ctx, "pend2"))
}
