package network

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
)

// TestRefresh: a kept attachment refreshed for a new start comes back as
// Attach left it after runsc's start took eth0's addresses and routes into
// its netstack (simulated by a flush), the proxied connection an old
// process left open is ended, and the sandbox reaches what its policy
// allows again. A refresh of an untouched namespace (runc) changes
// nothing; of an unknown sandbox is NotFound.
func TestRefresh(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	id := "refresh1"
	pol := policy(t, "rules", []string{"good.test"}, nil)
	att := e.attach(id, pol)
	ns := e.mgr.netnsPath(id)
	want := func(when string) {
		t.Helper()
		v4 := sh(t, "nsenter", "--net="+ns, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if !strings.Contains(v4, " "+att.IP.String()+"/") || strings.Count(v4, "inet ") != 1 {
			t.Errorf("%s: eth0's IPv4 addresses %q, want %s only", when, v4, att.IP)
		}
		if v6 := sh(t, "nsenter", "--net="+ns, "ip", "-6", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(v6, "fe80::") {
			t.Errorf("%s: eth0 has no link-local address: %q", when, v6)
		}
		if r := sh(t, "nsenter", "--net="+ns, "ip", "-4", "route", "show", "default"); !strings.Contains(r, "via "+att.Gateway.String()+" dev eth0") {
			t.Errorf("%s: default route %q, want via %s", when, r, att.Gateway)
		}
		if out, code := e.curl(id, nil, "http://good.test/"); code != 0 || !strings.HasPrefix(out, "host=good.test") {
			t.Errorf("%s: http://good.test/: exit %d %q", when, code, out)
		}
	}
	want("attached")

	// An old process's kept-alive connection through the proxy.
	opened := time.Now()
	conn, err := sandboxDialer(ns)(ctx, "tcp4", goodIP+":80")
	must(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("GET / HTTP/1.1\r\nHost: good.test\r\n\r\n"))
	must(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	must(t, err)
	resp.Body.Close()

	sh(t, "nsenter", "--net="+ns, "ip", "addr", "flush", "dev", "eth0") // what runsc's start does
	must(t, e.mgr.Refresh(ctx, id))
	// The proxy ends it (its RST finds no address to go to, as the
	// Sentry that held the other end is gone): the proxy logs an allowed
	// connection when it closes.
	if _, ok := e.waitDecision(func(d egress.Decision) bool {
		return d.SandboxID == id && d.Verdict == "allow" && d.Host == "good.test" && d.Time.After(opened)
	}); !ok {
		t.Errorf("the old connection through the proxy is still open after the refresh: %+v", e.decisions())
	}
	// What the start's hostnet.Up does with the kept attachment.
	must(t, e.mgr.UpdatePolicy(ctx, id, pol))
	want("refreshed")
	must(t, e.mgr.Refresh(ctx, id))
	must(t, e.mgr.UpdatePolicy(ctx, id, pol))
	want("refreshed again")

	if err := e.mgr.Refresh(ctx, "nosuch1"); !errs.Is(err, errs.NotFound) {
		t.Errorf("refresh of an unknown sandbox: %v, want NotFound", err)
	}
	must(t, e.mgr.Detach(ctx, id))
}
