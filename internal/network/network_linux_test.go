package network

import (
	"bufio"
	"context"
	"github.com/berth-dev/berth/internal/testutil"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEgress(t *testing.T) {
	e := newEnv(t)

	t.Run("default deny", func(t *testing.T) {
		e.attach("deny1", egress.Policy{Mode: egress.DenyAll})
		for _, url := range []string{"http://good.test/", "https://good.test/", "http://" + goodIP + "/", "https://" + goodIP + "/"} {
			if out, code := e.curl("deny1", nil, url); code == 0 {
				t.Errorf("%s reachable under deny-all: %q", url, out)
			}
		}
		if out, code := e.inSandbox("deny1", nil, "getent", "ahostsv4", "good.test"); code == 0 {
			t.Errorf("good.test resolves under deny-all: %q", out)
		}
		if _, ok := e.waitDecision(func(d egress.Decision) bool {
			return d.SandboxID == "deny1" && d.Proto == "tcp" && d.Verdict == "deny" && d.Rule == "mode:deny-all"
		}); !ok {
			t.Errorf("no deny decision logged: %+v", e.decisions())
		}
	})

	t.Run("allow one hostname", func(t *testing.T) {
		e.attach("host1", policy(t, "rules", []string{"good.test"}, nil))
		for _, url := range []string{"https://good.test/", "http://good.test/"} {
			out, code := e.curl("host1", nil, url)
			if code != 0 || !strings.HasPrefix(out, "host=good.test") {
				t.Errorf("%s: exit %d %q", url, code, out)
			}
		}
		for _, args := range [][]string{
			{"https://other.test/"},
			{"http://other.test/"},
			{"--insecure", "https://" + goodIP + "/"},                        // IP literal of the allowed name
			{"http://" + goodIP + "/"},                                       // ditto, plain HTTP
			{"--resolve", "other.test:443:" + goodIP, "https://other.test/"}, // right IP, wrong name
		} {
			if out, code := e.curl("host1", nil, args...); code == 0 {
				t.Errorf("curl %v allowed: %q", args, out)
			}
		}
		// A spoofed destination gains nothing: the proxy dials the name itself.
		out, code := e.curl("host1", nil, "--resolve", "good.test:443:"+otherIP, "https://good.test/")
		if code != 0 || !strings.HasPrefix(out, "host=good.test") {
			t.Errorf("good.test via spoofed IP: exit %d %q", code, out)
		}
		if out, code := e.inSandbox("host1", nil, "getent", "ahostsv4", "other.test"); code == 0 {
			t.Errorf("other.test resolves: %q", out)
		}
		// DNS sent to another resolver is answered by berth's.
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var c net.Conn
			err := testutil.InNetns(e.mgr.netnsPath("host1"), func() error {
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, "udp4", otherIP+":53")
				return err
			})
			return c, err
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		ips, err := r.LookupNetIP(ctx, "ip4", "good.test")
		if err != nil || len(ips) != 1 || ips[0].String() != goodIP {
			t.Errorf("DNS via %s:53 = %v, %v; want berth's answer %s", otherIP, ips, err, goodIP)
		}
		d, ok := e.waitDecision(func(d egress.Decision) bool {
			return d.SandboxID == "host1" && d.Verdict == "allow" && d.Proto == "tcp" && d.Host == "good.test" && d.BytesIn > 0
		})
		if !ok || d.Rule != "allow:good.test" || d.DstIP.String() == "" || d.BytesOut == 0 {
			t.Errorf("allow decision = %+v (found %v)", d, ok)
		}
		if _, ok := e.waitDecision(func(d egress.Decision) bool {
			return d.SandboxID == "host1" && d.Verdict == "deny" && d.Host == "other.test" && d.DstPort == 443
		}); !ok {
			t.Errorf("no deny decision for other.test")
		}
	})

	t.Run("wildcard", func(t *testing.T) {
		e.attach("wild1", policy(t, "rules", []string{"*.wild.test:443"}, nil))
		if out, code := e.curl("wild1", nil, "https://a.wild.test/"); code != 0 || !strings.HasPrefix(out, "host=a.wild.test") {
			t.Errorf("a.wild.test: exit %d %q", code, out)
		}
		if out, code := e.curl("wild1", nil, "http://a.wild.test/"); code == 0 {
			t.Errorf("port 80 allowed by a :443 rule: %q", out)
		}
		if out, code := e.curl("wild1", nil, "https://good.test/"); code == 0 {
			t.Errorf("good.test allowed: %q", out)
		}
	})

	t.Run("live update", func(t *testing.T) {
		att := e.attach("live1", policy(t, "rules", []string{"good.test"}, nil))
		// An open keep-alive connection allowed by the old policy.
		hc := &http.Client{Transport: &http.Transport{DialContext: sandboxDialer(att.NetNSPath)}}
		defer hc.CloseIdleConnections()
		conn, err := sandboxDialer(att.NetNSPath)(context.Background(), "tcp", goodIP+":80")
		must(t, err)
		defer conn.Close()
		br := bufio.NewReader(conn)
		get := func() error {
			if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: good.test\r\n\r\n"); err != nil {
				return err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.Body.Close()
		}
		must(t, get())
		if _, code := e.curl("live1", nil, "https://other.test/"); code == 0 {
			t.Fatal("other.test allowed before the update")
		}
		must(t, e.mgr.UpdatePolicy(context.Background(), "live1", policy(t, "rules", []string{"other.test"}, nil)))
		if err := get(); err == nil {
			t.Error("connection allowed only by the old policy survived the update")
		}
		if out, code := e.curl("live1", nil, "https://other.test/"); code != 0 || !strings.HasPrefix(out, "host=other.test") {
			t.Errorf("other.test after update: exit %d %q", code, out)
		}
		if out, code := e.curl("live1", nil, "https://good.test/"); code == 0 {
			t.Errorf("good.test after update: %q", out)
		}
		// The same policy again (as every sandbox at a daemon start): no
		// ruleset load, no state write, and the policy still holds.
		before, err := os.Stat(e.mgr.statePath())
		must(t, err)
		must(t, e.mgr.UpdatePolicy(context.Background(), "live1", policy(t, "rules", []string{"other.test"}, nil)))
		if after, err := os.Stat(e.mgr.statePath()); err != nil || !os.SameFile(before, after) {
			t.Errorf("an unchanged policy rewrote the network state (%v)", err)
		}
		if out, code := e.curl("live1", nil, "https://other.test/"); code != 0 || !strings.HasPrefix(out, "host=other.test") {
			t.Errorf("other.test after the same policy again: exit %d %q", code, out)
		}
		if err := e.mgr.UpdatePolicy(context.Background(), "live1", egress.Policy{Mode: "open"}); !errs.Is(err, errs.InvalidArgument) {
			t.Errorf("bad policy: %v", err)
		}
		if err := e.mgr.UpdatePolicy(context.Background(), "nosuch", egress.Policy{Mode: egress.DenyAll}); !errs.Is(err, errs.NotFound) {
			t.Errorf("unknown sandbox: %v", err)
		}
	})

	t.Run("dns rebinding", func(t *testing.T) {
		e.attach("rebind1", policy(t, "rules", []string{"rebind.test", "local.test"}, nil))
		for _, name := range []string{"rebind.test", "local.test"} {
			if out, code := e.inSandbox("rebind1", nil, "getent", "ahostsv4", name); code == 0 {
				t.Errorf("%s resolves to a private address: %q", name, out)
			}
		}
		if _, ok := e.waitDecision(func(d egress.Decision) bool {
			return d.SandboxID == "rebind1" && d.Proto == "dns" && d.Rule == "dns-rebinding" && d.Host == "rebind.test"
		}); !ok {
			t.Errorf("no dns-rebinding decision: %+v", e.decisions())
		}
		// The proxy does not dial it either, whatever IP the sandbox uses.
		if out, code := e.curl("rebind1", nil, "--resolve", "rebind.test:80:"+goodIP, "http://rebind.test/"); code == 0 {
			t.Errorf("proxy dialled a private answer: %q", out)
		}
		// A tenant's own CIDR rule does not open a private range (only
		// the server's AllowPrivate does, see the egress tests).
		must(t, e.mgr.UpdatePolicy(context.Background(), "rebind1", policy(t, "rules", []string{"rebind.test", "192.168.77.0/24"}, nil)))
		if out, code := e.inSandbox("rebind1", nil, "getent", "ahostsv4", "rebind.test"); code == 0 {
			t.Errorf("rebind.test resolves with a tenant CIDR rule for its private range: %q", out)
		}
		if err := e.px.CheckPolicy(policy(t, "rules", []string{"192.168.77.0/24"}, nil)); !errs.Is(err, errs.InvalidArgument) {
			t.Errorf("CheckPolicy(allow 192.168.77.0/24) = %v, want InvalidArgument", err)
		}
	})

	t.Run("credential injection", func(t *testing.T) {
		e.attach("cred1", policy(t, "rules", []string{"secret.test", "good.test"}, nil))
		g := egress.Grant{Name: "GH_TOKEN", Host: "secret.test", HeaderTemplate: "Authorization: Bearer {{value}}",
			Value: testToken, Placeholder: egress.NewPlaceholder("GH_TOKEN")}
		must(t, e.px.SetGrants("cred1", []egress.Grant{g}))
		envv := []string{"GH_TOKEN=" + g.Placeholder}
		out, code := e.inSandbox("cred1", envv, "sh", "-c", `printf %s "$GH_TOKEN"`)
		if code != 0 || out != g.Placeholder || strings.Contains(out, testToken) {
			t.Fatalf("sandbox env GH_TOKEN = %q", out)
		}
		out, code = e.curl("cred1", envv, "-H", "Authorization: token "+g.Placeholder, "https://secret.test/")
		if code != 0 || out != "host=secret.test auth=Bearer "+testToken {
			t.Errorf("secret.test saw %q (exit %d)", out, code)
		}
		// Another host gets the placeholder, never the value.
		out, code = e.curl("cred1", envv, "-H", "Authorization: Bearer "+g.Placeholder, "https://good.test/")
		if code != 0 || strings.Contains(out, testToken) || !strings.Contains(out, g.Placeholder) {
			t.Errorf("good.test saw %q (exit %d)", out, code)
		}
		d, ok := e.waitDecision(func(d egress.Decision) bool { return d.SandboxID == "cred1" && d.Intercepted })
		if !ok || d.Host != "secret.test" || d.Verdict != "allow" || d.BytesIn == 0 {
			t.Errorf("intercepted decision = %+v (found %v)", d, ok)
		}
		must(t, e.px.SetGrants("cred1", nil))
		out, _ = e.curl("cred1", envv, "-H", "Authorization: token "+g.Placeholder, "https://secret.test/")
		if strings.Contains(out, testToken) {
			t.Errorf("revoked grant still injected: %q", out)
		}
	})

	t.Run("dial sandbox", func(t *testing.T) {
		att := e.attach("port1", egress.Policy{Mode: egress.DenyAll})
		var ln net.Listener
		must(t, testutil.InNetns(att.NetNSPath, func() error {
			var err error
			ln, err = net.Listen("tcp4", ":8080")
			return err
		}))
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				_, _ = io.WriteString(c, "hello from sandbox")
				c.Close()
			}
		}()
		c, err := e.mgr.DialSandbox(context.Background(), "port1", 8080)
		must(t, err)
		defer c.Close()
		b, _ := io.ReadAll(c)
		if string(b) != "hello from sandbox" {
			t.Errorf("read %q", b)
		}
	})

	t.Run("fail closed without proxy", func(t *testing.T) {
		e.attach("closed1", egress.Policy{Mode: egress.AllowAll})
		if out, code := e.curl("closed1", nil, "https://good.test/"); code != 0 || !strings.HasPrefix(out, "host=good.test") {
			t.Fatalf("allow-all: exit %d %q", code, out)
		}
		e.stopProxy()
		if out, code := e.curl("closed1", nil, "--resolve", "good.test:443:"+goodIP, "https://good.test/"); code == 0 {
			t.Errorf("egress works with the proxy down: %q", out)
		}
	})
}

func TestAttachCleanupAndReconcile(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	att := e.attach("clean1", egress.Policy{Mode: egress.AllowAll})
	veth := e.mgr.vethName("clean1")
	if _, err := os.Stat(att.NetNSPath); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mgr.Attach(ctx, "clean1", egress.Policy{Mode: egress.DenyAll}); !errs.Is(err, errs.AlreadyExists) {
		t.Errorf("second attach: %v", err)
	}
	if _, err := e.mgr.Attach(ctx, "Bad-ID", egress.Policy{Mode: egress.DenyAll}); errs.FieldOf(err) != "sandbox_id" {
		t.Errorf("bad id: %v", err)
	}
	must(t, e.mgr.Detach(ctx, "clean1"))
	must(t, e.mgr.Detach(ctx, "clean1")) // idempotent
	assertGone(t, att.NetNSPath, veth)

	// A crash leaves a sandbox the daemon no longer knows plus a stray
	// namespace; a new manager over the same state dir cleans both.
	att2 := e.attach("crash1", egress.Policy{Mode: egress.DenyAll})
	stray := filepath.Join(e.mgr.Config().StateDir, "netns", "stray1")
	must(t, createNetns(ctx, stray))
	cfg := e.mgr.Config()
	m2, err := New(cfg)
	must(t, err)
	must(t, m2.Setup(ctx))
	if got, ok := m2.Get("crash1"); !ok || got.IP != att2.IP {
		t.Fatalf("restarted manager lost crash1: %+v", got)
	}
	must(t, m2.Reconcile(ctx, nil))
	assertGone(t, att2.NetNSPath, e.mgr.vethName("crash1"))
	assertGone(t, stray, "")
	e.mgr = m2
	// Nothing detached since the last load: Reconcile loads no ruleset.
	loads := m2.loads.count()
	must(t, m2.Reconcile(ctx, nil))
	if got := m2.loads.count(); got != loads {
		t.Errorf("a Reconcile that changed nothing loaded the ruleset %d time(s)", got-loads)
	}

	must(t, m2.Teardown(ctx))
	if out, err := runOut("nft", "list", "table", "inet", cfg.Table); err == nil {
		t.Errorf("nft table left after teardown:\n%s", out)
	}
	if _, err := runOut("ip", "link", "show", "dev", cfg.BridgeName); err == nil {
		t.Errorf("bridge %s left after teardown", cfg.BridgeName)
	}
	if links, _ := listLinks(ctx, cfg.VethPrefix); len(links) > 0 {
		t.Errorf("veths left: %v", links)
	}
}

func assertGone(t *testing.T, nsPath, veth string) {
	t.Helper()
	if _, err := os.Stat(nsPath); !os.IsNotExist(err) {
		t.Errorf("netns %s still there: %v", nsPath, err)
	}
	if veth != "" {
		if _, err := runOut("ip", "link", "show", "dev", veth); err == nil {
			t.Errorf("veth %s still there", veth)
		}
	}
}

func runOut(args ...string) (string, error) {
	return run(context.Background(), "", args[0], args[1:]...)
}

// A server restarted with another subnet (or veth prefix) must not refuse
// to start over sandboxes attached under the old one: they are reattached
// inside the namespaces they run in, and the layout is saved.
func TestSetupReattachesOnLayoutChange(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	old := e.attach("move1", egress.Policy{Mode: egress.DenyAll})
	keepNS := e.attach("gone1", egress.Policy{Mode: egress.DenyAll})
	// gone1's namespace vanishes while the daemon is down: it cannot be
	// reattached, and must not stop the start either.
	must(t, deleteNetns(keepNS.NetNSPath))

	cfg := e.mgr.Config()
	saved, ok, err := SavedLayout(cfg.StateDir)
	if err != nil || !ok || saved.Subnet != cfg.Subnet || saved.Bridge != cfg.BridgeName {
		t.Fatalf("saved layout %+v ok=%v err=%v, want subnet %s", saved, ok, err, cfg.Subnet)
	}
	a := cfg.Subnet.Addr().As4()
	a[2]++
	cfg.Subnet = netip.PrefixFrom(netip.AddrFrom4(a), 24)
	cfg.VethPrefix = cfg.VethPrefix[:3] + "q"
	oldBridge, oldTable := cfg.BridgeName, cfg.Table
	cfg.BridgeName, cfg.Table = "btn"+oldBridge[3:], "btn"+oldTable[3:]
	// And a damaged record in the state file (an id no chain can carry, a
	// policy that does not validate) must not stop the start either.
	state := filepath.Join(cfg.StateDir, "network.json")
	b, err := os.ReadFile(state)
	must(t, err)
	b = []byte(strings.Replace(string(b), "{", `{"Bad-ID": {"ip": "10.1.2.3", "veth": "x", "policy": {"mode": "deny-all"}},
		"bad2": {"ip": "10.1.2.4", "veth": "y", "policy": {"mode": "bogus"}},`, 1))
	must(t, os.WriteFile(state, b, 0o600))
	m2, err := New(cfg)
	must(t, err)
	e.mgr = m2 // cleanup tears this one down
	must(t, m2.Setup(ctx))

	got, ok := m2.Get("move1")
	if !ok || !cfg.Subnet.Contains(got.IP) || got.NetNSPath != old.NetNSPath {
		t.Fatalf("move1 after the layout change: %+v ok=%v (subnet %s)", got, ok, cfg.Subnet)
	}
	if _, ok := m2.Get("gone1"); ok {
		t.Errorf("gone1 kept an attachment without a namespace")
	}
	moved, lost := m2.Reattached()
	if moved["move1"] == "" || lost["gone1"] == "" || lost["Bad-ID"] == "" || lost["bad2"] == "" || len(moved) != 1 || len(lost) != 3 {
		t.Errorf("Reattached: moved %v lost %v", moved, lost)
	}
	inside, err := runOut("nsenter", "--net="+old.NetNSPath, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	must(t, err)
	if !strings.Contains(inside, got.IP.String()+"/24") || strings.Contains(inside, old.IP.String()+"/") {
		t.Errorf("eth0 in the namespace: %s (want %s, not %s)", inside, got.IP, old.IP)
	}
	route, err := runOut("nsenter", "--net="+old.NetNSPath, "ip", "-4", "route", "show", "default")
	must(t, err)
	if !strings.Contains(route, "via "+cfg.Gateway().String()) {
		t.Errorf("default route in the namespace: %q, want via %s", route, cfg.Gateway())
	}
	br, err := runOut("ip", "-4", "-o", "addr", "show", "dev", cfg.BridgeName)
	must(t, err)
	if !strings.Contains(br, cfg.Gateway().String()+"/24") || strings.Contains(br, old.Gateway.String()+"/") {
		t.Errorf("bridge addresses: %s", br)
	}
	if _, err := runOut("ip", "link", "show", "dev", oldBridge); err == nil {
		t.Errorf("the previous layout's bridge %s is still there", oldBridge)
	}
	if out, err := runOut("nft", "list", "table", "inet", oldTable); err == nil {
		t.Errorf("the previous layout's table %s is still there:\n%s", oldTable, out)
	}
	if master, _ := linkMasters(ctx); master[e.mgr.vethName("move1")] != cfg.BridgeName {
		t.Errorf("move1's veth hangs on %q, want %s", master[e.mgr.vethName("move1")], cfg.BridgeName)
	}
	if links, _ := listLinks(ctx, e.mgr.vethName("move1")); len(links) != 1 {
		t.Errorf("veth of move1 under the new prefix: %v", links)
	}
	if saved, _, _ := SavedLayout(cfg.StateDir); saved.Subnet != cfg.Subnet || saved.VethPrefix != cfg.VethPrefix {
		t.Errorf("layout not saved: %+v", saved)
	}
	// A third start over the same state changes nothing.
	m3, err := New(cfg)
	must(t, err)
	must(t, m3.Setup(ctx))
	if again, _ := m3.Get("move1"); again.IP != got.IP {
		t.Errorf("address moved again on an unchanged layout: %s → %s", got.IP, again.IP)
	}
	if moved, lost := m3.Reattached(); len(moved)+len(lost) != 0 {
		t.Errorf("unchanged layout reattached: %v %v", moved, lost)
	}
	e.mgr = m3
}

// A sandbox detached and attached again (a runsc rewind halts and
// re-attaches) gets its address back even when a lower one is free, and
// a new sandbox does not take a detached sandbox's address while another
// is free (the rewind in TestRewindKeepsNetwork saw its address change
// to a neighbour's freed lower one).
func TestReattachKeepsTheAddress(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pol := egress.Policy{Mode: egress.DenyAll}
	low := e.attach("low1", pol)
	mine := e.attach("mine1", pol)
	must(t, e.mgr.Detach(ctx, "low1"))
	must(t, e.mgr.Detach(ctx, "mine1"))
	again := e.attach("mine1", pol)
	if again.IP != mine.IP {
		t.Errorf("re-attached at %s, had %s (the lower %s was free)", again.IP, mine.IP, low.IP)
	}
	fresh := e.attach("new1", pol)
	if fresh.IP == low.IP || fresh.IP == mine.IP {
		t.Errorf("a new sandbox took %s, a detached or attached sandbox's address, with others free", fresh.IP)
	}
	// low1's address stays its own until nothing else is free; when it comes
	// back it has it.
	lowAgain := e.attach("low1", pol)
	if lowAgain.IP != low.IP {
		t.Errorf("low1 came back at %s, had %s", lowAgain.IP, low.IP)
	}
	for _, id := range []string{"mine1", "new1", "low1"} {
		must(t, e.mgr.Detach(ctx, id))
	}
}
