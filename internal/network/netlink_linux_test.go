package network

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/egress"
)

// TestNetlinkAttachState checks what the in-process netlink calls leave in
// the kernel, as `ip` (an independent reader) sees it: eth0 with the
// sandbox's address, up, the default route via the gateway, lo up; the
// host end an isolated port of the bridge, up. And no OS thread of the
// daemon is left in a sandbox's namespace by the locked-thread work.
func TestNetlinkAttachState(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for i := range 4 { // several rounds: threads are reused across them
		id := fmt.Sprintf("nl%d", i)
		att := e.attach(id, egress.Policy{Mode: egress.DenyAll})
		in := func(args ...string) string {
			return sh(t, append([]string{"nsenter", "--net=" + att.NetNSPath, "ip"}, args...)...)
		}
		addr := in("-4", "-o", "addr", "show", "dev", "eth0")
		want := fmt.Sprintf("inet %s/%d ", att.IP, e.mgr.Config().Subnet.Bits())
		if !strings.Contains(addr, want) || strings.Contains(addr, " brd ") {
			t.Errorf("%s: eth0 addresses %q, want %q and no broadcast address (as ip sets it)", id, addr, want)
		}
		if l := in("-o", "link", "show", "dev", "eth0"); !strings.Contains(l, ",UP") {
			t.Errorf("%s: eth0 not up: %s", id, l)
		}
		if l := in("-o", "link", "show", "dev", "lo"); !strings.Contains(l, ",UP") {
			t.Errorf("%s: lo not up: %s", id, l)
		}
		if r := in("route", "show", "default"); !strings.Contains(r, "default via "+att.Gateway.String()+" dev eth0") {
			t.Errorf("%s: default route %q", id, r)
		}
		if gw := sh(t, "ip", "-4", "-o", "addr", "show", "dev", e.mgr.Config().BridgeName); strings.Contains(gw, " brd ") {
			t.Errorf("bridge address %q has a broadcast address", gw)
		}
		veth := e.mgr.vethName(id)
		host := sh(t, "ip", "-d", "-o", "link", "show", "dev", veth)
		for _, w := range []string{"master " + e.mgr.Config().BridgeName, "isolated on", ",UP"} {
			if !strings.Contains(host, w) {
				t.Errorf("%s: host end %s lacks %q: %s", id, veth, w, host)
			}
		}
		assertThreadsInHostNetns(t)
		if i%2 == 1 {
			must(t, e.mgr.Detach(ctx, id))
			assertGone(t, att.NetNSPath, veth)
		}
	}
}

func assertThreadsInHostNetns(t *testing.T) {
	t.Helper()
	host, err := os.Readlink(fmt.Sprintf("/proc/self/task/%d/ns/net", os.Getpid()))
	must(t, err)
	tasks, err := os.ReadDir("/proc/self/task")
	must(t, err)
	for _, task := range tasks {
		ns, err := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns/net"))
		if err != nil {
			continue // the thread ended
		}
		if ns != host {
			t.Errorf("thread %s is in network namespace %s, not the host's %s", task.Name(), ns, host)
		}
	}
}
