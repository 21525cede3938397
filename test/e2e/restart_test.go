package e2e

import (
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testutil"
)

// startServerDerivedNet is startServer without the test's own network
// flags: the server derives its bridge, table and subnet from its data dir,
// as every `berth serve --data-dir DIR` does.
func startServerDerivedNet(t *testing.T) *server {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	for _, tool := range []string{"ip", "nft", "unshare", "nsenter"} {
		testutil.RequireTool(t, tool)
	}
	bin := testutil.BuildBinaries(t)
	dataDir, err := os.MkdirTemp("", "be")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, bin: bin, dataDir: dataDir}
	s.start()
	// Runs after s.cleanup: whatever a failed test left of the derived
	// network goes too.
	var layout struct{ Bridge, Table string }
	b, _ := os.ReadFile(filepath.Join(dataDir, "network", "layout.json"))
	if err := json.Unmarshal(b, &layout); err != nil || layout.Bridge == "" {
		t.Fatalf("no network layout saved in the data dir: %q %v", b, err)
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", "dev", layout.Bridge).Run()
		_ = exec.Command("nft", "delete", "table", "inet", layout.Table).Run()
		_ = exec.Command("nft", "delete", "table", "bridge", layout.Table).Run()
	})
	t.Cleanup(func() { s.cleanup() })
	if out, code := s.run("template", "import", "tiny", tinyTar(t)); code != 0 {
		t.Fatalf("template import: %s", out)
	}
	return s
}

var inetRE = regexp.MustCompile(`inet ([0-9.]+)/`)

// sandboxAddr is the sandbox's eth0 address as its own processes see it.
func sandboxAddr(t *testing.T, s *server, id string) string {
	t.Helper()
	out := s.must("exec", id, "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	m := inetRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("%s has no IPv4 address on eth0: %q", id, out)
	}
	return m[1]
}

// TestRestartKeepsSandboxes: a server with a non-default data dir (so a
// derived network) restarts, after kill -9 or a plain stop, while its
// sandboxes keep running; every one of them answers afterwards, at the
// address it had, and the server derived the same network.
func TestRestartKeepsSandboxes(t *testing.T) {
	requireRunsc(t)
	for _, how := range []string{"kill9", "sigterm"} {
		t.Run(how, func(t *testing.T) {
			s := startServerDerivedNet(t)
			addrs := map[string]string{}
			for _, rt := range []string{"runc", "runsc"} {
				id := s.create("--runtime", rt)
				s.must("exec", id, "--", "sh", "-c", "echo "+rt+" > /tmp/mark")
				addrs[id] = sandboxAddr(t, s, id)
			}
			layout, _ := os.ReadFile(filepath.Join(s.dataDir, "network", "layout.json"))
			for restart := 0; restart < 2; restart++ {
				if how == "kill9" {
					s.kill9()
				} else {
					s.stop()
				}
				s.start()
				for id, addr := range addrs {
					if v := inspect(t, s, id); v.State != "running" {
						t.Fatalf("restart %d: %s is %s, want running\n%s", restart, id, v.State, s.logs())
					}
					if out, code := s.run("exec", id, "--", "cat", "/tmp/mark"); code != 0 || !strings.Contains("runc runsc", strings.TrimSpace(out)) {
						t.Fatalf("restart %d: exec in %s: %d %q", restart, id, code, out)
					}
					if got := sandboxAddr(t, s, id); got != addr {
						t.Errorf("restart %d: %s moved from %s to %s on an unchanged data dir", restart, id, addr, got)
					}
				}
				if now, _ := os.ReadFile(filepath.Join(s.dataDir, "network", "layout.json")); string(now) != string(layout) {
					t.Errorf("restart %d: network layout changed:\n%s\n→\n%s", restart, layout, now)
				}
			}
			// A new sandbox after the restarts gets a network too.
			id := s.create()
			sandboxAddr(t, s, id)
		})
	}
}

// TestRestartWithAnotherSubnet: the operator restarts the server with
// another subnet while sandboxes run. The server starts anyway and every
// sandbox answers. A runc sandbox is reattached inside its own namespace (an
// event says from which address to which) and reaches what its policy
// allows through the new gateway; a runsc sandbox (whose netstack took its
// interfaces at boot) is told to have lost its network, and has it back
// after a stop/start.
func TestRestartWithAnotherSubnet(t *testing.T) {
	requireRunsc(t)
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	ids := map[string]string{}
	for _, rt := range []string{"runc", "runsc"} {
		id := s.create("--runtime", rt, "--allow", "good.test")
		if out, ok := s.fetch(id, "http://good.test/"); !ok {
			t.Fatalf("%s: good.test before the restart: %s", rt, out)
		}
		ids[id] = rt
	}
	s.kill9()
	other := ""
	for i, a := range s.netArgs {
		if a == "--network-subnet" {
			p := netip.MustParsePrefix(s.netArgs[i+1])
			b := p.Addr().As4()
			for j := 1; j < 64 && other == ""; j++ {
				q := netip.PrefixFrom(netip.AddrFrom4([4]byte{b[0], b[1], b[2] + byte(j), 0}), 24)
				if !hostUses(q) {
					other = q.String()
				}
			}
			s.netArgs[i+1] = other
		}
	}
	if other == "" {
		t.Fatal("no free /24 next to the test subnet")
	}
	s.start()
	q := netip.MustParsePrefix(other)
	for id, rt := range ids {
		if v := inspect(t, s, id); v.State != "running" {
			t.Fatalf("%s: %s after the restart, want running", rt, v.State)
		}
		var evs []struct{ Reason, Message string }
		_ = json.Unmarshal([]byte(s.must("events", id, "--json")), &evs)
		want := map[string]string{"runc": "network_reattached", "runsc": "network_lost"}[rt]
		found := false
		for _, e := range evs {
			found = found || e.Reason == want
		}
		if !found {
			t.Errorf("%s: no %s event: %+v", rt, want, evs)
		}
		if out, code := s.run("exec", id, "--", "cat", "/proc/self/status"); code != 0 {
			t.Errorf("%s: exec after the reattach: %d %s", rt, code, out)
		}
		if rt == "runsc" {
			s.must("stop", id)
			s.must("start", id)
		}
		if a := netip.MustParseAddr(sandboxAddr(t, s, id)); !q.Contains(a) {
			t.Errorf("%s: address %s after the restart, want one in %s", rt, a, q)
		}
		if out, ok := s.fetch(id, "http://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
			t.Errorf("%s: good.test after the reattach: %q", rt, out)
		}
		if out, ok := s.fetch(id, "http://other.test/"); ok {
			t.Errorf("%s: other.test after the reattach: %s", rt, out)
		}
	}
}
