package e2e

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/testutil"
)

// testNetwork gives one `berth serve` a network of its own (bridge,
// nftables table, veth prefix, subnet) so that servers running at the same
// time on this host never share one, and removes it once the server is gone
// (a stopped daemon keeps its bridge on purpose: sandboxes outlive it).
func testNetwork(t *testing.T) []string {
	t.Helper()
	for _, tool := range []string{"ip", "nft", "unshare", "nsenter"} {
		testutil.RequireTool(t, tool)
	}
	var rb [5]byte
	_, _ = rand.Read(rb[:])
	sfx := hex.EncodeToString(rb[:3])
	name := "be" + sfx
	subnet := ""
	for i := 0; i < 64 && subnet == ""; i++ {
		_, _ = rand.Read(rb[3:])
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 216 + rb[3]%16, rb[4], 0}), 24)
		if !hostUses(p) {
			subnet = p.String()
		}
	}
	if subnet == "" {
		t.Fatal("no free /24 in 10.216.0.0/12 for the test network")
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", "dev", name).Run()
		_ = exec.Command("nft", "delete", "table", "inet", name).Run()
		_ = exec.Command("nft", "delete", "table", "bridge", name).Run()
	})
	return []string{"--network-bridge", name, "--network-table", name, "--network-veth-prefix", "z" + sfx[:3],
		"--network-subnet", subnet}
}

// hostUses reports whether any host address lies in p.
func hostUses(p netip.Prefix) bool {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Overlaps(p) {
			return true
		}
	}
	return false
}

// testToken is the credential only the "internet" server and berth know.
const testToken = "real-token-7c1e9a"

// internet is this test's stand-in for the internet: a network namespace
// the test creates, reached from the host over a veth, holding three
// addresses the test assigns in 198.18.0.0/15 (the benchmarking range, not
// private, so berth treats them as public), each with an HTTP (:80) and an
// HTTPS (:443) server. The names resolve through the hosts file berth's
// egress resolver reads (serve --egress-hosts); no query leaves the host.
type internet struct {
	hosts  string // hosts file
	ca     string // PEM of the CA that signed the servers (serve --upstream-ca)
	prefix string // e.g. "198.18.7"

	// counts are the requests other than GET each /count/NAME received
	// (the side-effect tests' counting endpoint).
	mu     sync.Mutex
	counts map[string]int
}

// Count is how many non-GET requests /count/name received.
func (n *internet) Count(name string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.counts[name]
}

func (n *internet) serveArgs() []string {
	return []string{"--egress-hosts", n.hosts, "--upstream-ca", n.ca}
}

func newInternet(t *testing.T) *internet {
	t.Helper()
	testutil.RequireRoot(t)
	dir := t.TempDir()
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	n := &internet{}
	for i := 0; ; i++ {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18 + rb[0]%2, rb[1], 0}), 24)
		if !hostUses(p) {
			n.prefix = fmt.Sprintf("198.%d.%d", 18+rb[0]%2, rb[1])
			break
		}
		if i > 64 {
			t.Fatal("no free /24 in 198.18.0.0/15")
		}
		_, _ = rand.Read(rb[:])
	}
	ns := filepath.Join(dir, "inet")
	veth := "bei" + hex.EncodeToString(rb[2:])
	if err := os.WriteFile(ns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "unshare", "--net="+ns, "true")
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", "dev", veth).Run()
		_ = unix.Unmount(ns, unix.MNT_DETACH)
	})
	run(t, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
	run(t, "ip", "addr", "add", n.prefix+".1/24", "dev", veth)
	run(t, "ip", "link", "set", veth, "up")
	for _, c := range []string{"link set lo up", "addr add " + n.prefix + ".10/24 dev eth0", "addr add " + n.prefix + ".11/24 dev eth0",
		"addr add " + n.prefix + ".12/24 dev eth0", "link set eth0 up", "route add default via " + n.prefix + ".1"} {
		run(t, append([]string{"nsenter", "--net=" + ns, "ip"}, strings.Fields(c)...)...)
	}
	n.hosts = filepath.Join(dir, "hosts")
	hosts := fmt.Sprintf("%[1]s.10 good.test\n%[1]s.11 other.test\n%[1]s.12 secret.test\n", n.prefix)
	if err := os.WriteFile(n.hosts, []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	n.ca = filepath.Join(dir, "ca.pem")
	n.startServers(t, ns)
	return n
}

// authState says what a header held without echoing a secret back.
func authState(v string) string {
	switch {
	case v == "":
		return "none"
	case strings.Contains(v, testToken):
		return "real"
	case strings.Contains(v, "berth-secret-"):
		return "placeholder"
	}
	return "other"
}

func (n *internet) startServers(t *testing.T, ns string) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e internet"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(2 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSNames: []string{"good.test", "other.test", "secret.test"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	n.counts = map[string]int{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := strings.CutPrefix(r.URL.Path, "/count/"); ok {
			b, _ := io.ReadAll(r.Body)
			n.mu.Lock()
			if r.Method != http.MethodGet {
				n.counts[name]++
			}
			c := n.counts[name]
			n.mu.Unlock()
			fmt.Fprintf(w, "count=%d key=%s body=%d\n", c, r.Header.Get("Idempotency-Key"), len(b))
			return
		}
		fmt.Fprintf(w, "host=%s auth=%s xkey=%s uri=%s\n", r.Host, authState(r.Header.Get("Authorization")),
			authState(r.Header.Get("X-Key")), authState(r.URL.RequestURI()))
	})
	var plain, secure net.Listener
	err = testutil.InNetns(ns, func() error {
		var err error
		if plain, err = net.Listen("tcp4", ":80"); err != nil {
			return err
		}
		secure, err = net.Listen("tcp4", ":443")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	tsrv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(plain) })
	wg.Go(func() { _ = tsrv.ServeTLS(secure, "", "") })
	t.Cleanup(func() {
		srv.Close()
		tsrv.Close()
		wg.Wait()
	})
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// fetch runs busybox wget inside the sandbox; wgetArgs go before the URL.
func (s *server) fetch(id, url string, wgetArgs ...string) (string, bool) {
	s.t.Helper()
	cmd := "timeout 15 wget -q -O- " + strings.Join(wgetArgs, " ") + " " + url + " 2>&1"
	out, code := s.run("exec", id, "--", "sh", "-c", cmd)
	return out, code == 0
}

// installFetch copies the static HTTPS client and the test internet's CA
// into the sandbox (/home/user/fetch, /home/user/ca/test.pem).
func (s *server) installFetch(id string, inet *internet) {
	s.t.Helper()
	bin := testutil.BuildProgram(s.t, "./test/e2e/testdata/fetch")
	s.must("exec", id, "--", "mkdir", "-p", "/home/user/ca")
	s.must("cp", bin, id+":/home/user/fetch")
	s.must("cp", inet.ca, id+":/home/user/ca/test.pem")
	s.must("exec", id, "--", "chmod", "755", "/home/user/fetch")
}

// fetchTLS runs the HTTPS client in the sandbox, trusting the test CA and
// berth's egress CA (which berth mounts at /usr/local/share/ca-certificates).
func (s *server) fetchTLS(id, url string, headers ...string) (string, bool) {
	s.t.Helper()
	args := []string{"exec", "--env", "SSL_CERT_DIR=/home/user/ca:/usr/local/share/ca-certificates", id, "--", "/home/user/fetch"}
	for _, h := range headers {
		args = append(args, "-H", h)
	}
	out, code := s.run(append(args, url)...)
	return out, code == 0
}

// egressEntry mirrors server.EgressEntry (the JSON of `berth net log --json`).
type egressEntry struct {
	Seq         int64  `json:"seq"`
	Proto       string `json:"proto"`
	DstIP       string `json:"dst_ip"`
	DstPort     int    `json:"dst_port"`
	Host        string `json:"host"`
	Verdict     string `json:"verdict"`
	Rule        string `json:"rule"`
	Intercepted bool   `json:"intercepted"`
	BytesIn     int64  `json:"bytes_in"`
}

func (s *server) netLog(id string) []egressEntry {
	s.t.Helper()
	var out []egressEntry
	if err := json.Unmarshal([]byte(s.must("net", "log", id, "--json")), &out); err != nil {
		s.t.Fatal(err)
	}
	return out
}

// waitLog waits for an entry (allowed connections are logged when they end).
func (s *server) waitLog(id string, f func(egressEntry) bool) (egressEntry, bool) {
	var found egressEntry
	err := testutil.Within(5 * time.Second).Every(100 * time.Millisecond).Until(func() error {
		for _, e := range s.netLog(id) {
			if f(e) {
				found = e
				return nil
			}
		}
		return errNoEntry
	})
	return found, err == nil
}

var errNoEntry = errors.New("no matching egress log entry")

func TestNetworkPolicy(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)

	// Default: deny-all. Names do not resolve, addresses are refused.
	closed := s.create()
	if out, ok := s.fetch(closed, "http://good.test/"); ok {
		t.Fatalf("default policy let good.test through: %s", out)
	}
	if out, ok := s.fetch(closed, "http://"+inet.prefix+".10/"); ok {
		t.Fatalf("default policy let %s.10 through: %s", inet.prefix, out)
	}
	if _, ok := s.waitLog(closed, func(e egressEntry) bool { return e.Verdict == "deny" && e.Proto == "tcp" }); !ok {
		t.Errorf("no tcp denial in the log: %+v", s.netLog(closed))
	}
	if out := s.must("net", "show", closed); !strings.Contains(out, "deny-all") {
		t.Errorf("net show: %s", out)
	}

	// A malformed rule is a 400 that names it.
	if out, code := s.run("create", "--template", "tiny", "--allow", "bad host!"); code != 2 || !strings.Contains(out, "bad host!") {
		t.Errorf("create --allow 'bad host!': exit %d: %s", code, out)
	}

	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" && !strings.Contains(s.must("info"), "runsc") {
				testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
			}
			id := s.create("--runtime", rt, "--allow", "good.test")
			s.installFetch(id, inet)
			if out, ok := s.fetch(id, "http://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
				t.Errorf("http://good.test/ with good.test allowed: %q", out)
			}
			if out, ok := s.fetchTLS(id, "https://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
				t.Errorf("https://good.test/ with good.test allowed: %q", out)
			}
			if out, ok := s.fetch(id, "http://other.test/"); ok {
				t.Errorf("other.test got through an allow list of good.test: %s", out)
			}
			// Replace the policy live: now only other.test.
			if out := s.must("net", "set", id, "--allow", "other.test"); !strings.Contains(out, "other.test") {
				t.Errorf("net set: %s", out)
			}
			if out, ok := s.fetch(id, "http://other.test/"); !ok || !strings.Contains(out, "host=other.test") {
				t.Errorf("other.test after net set: %q", out)
			}
			if out, ok := s.fetch(id, "http://good.test/"); ok {
				t.Errorf("good.test still reachable after net set: %s", out)
			}
			if _, ok := s.waitLog(id, func(e egressEntry) bool {
				return e.Verdict == "allow" && e.Host == "other.test" && e.Proto == "tcp" && e.BytesIn > 0
			}); !ok {
				t.Errorf("no allowed other.test connection in the log: %+v", s.netLog(id))
			}
			// The policy survives a disk pause and resume.
			s.must("pause", id, "--mode", "disk")
			s.must("resume", id)
			if out, ok := s.fetch(id, "http://other.test/"); !ok {
				t.Errorf("other.test after pause/resume: %q", out)
			}
			if out, ok := s.fetch(id, "http://good.test/"); ok {
				t.Errorf("good.test reachable after pause/resume: %s", out)
			}
		})
	}
}

func TestNetworkSecretInjection(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	out, code := s.runAs(s.key, strings.NewReader(testToken+"\n"), "secret", "set", "TOKEN", "--host", "secret.test",
		"--header", "Authorization: Bearer {{value}}")
	if code != 0 {
		t.Fatalf("secret set: %s", out)
	}
	if ls := s.must("secret", "ls"); !strings.Contains(ls, "secret.test") || strings.Contains(ls, testToken) {
		t.Errorf("secret ls: %s", ls)
	}
	if out, code := s.run("create", "--template", "tiny", "--secret", "NOPE"); code == 0 || !strings.Contains(out, "NOPE") {
		t.Errorf("create --secret NOPE: exit %d: %s", code, out)
	}
	id := s.create("--secret", "TOKEN", "--allow", "good.test", "--disk", "64")

	env := s.must("exec", id, "--", "env")
	if strings.Contains(env, testToken) || !strings.Contains(env, "TOKEN=berth-secret-token-") {
		t.Fatalf("env inside the sandbox: %s", env)
	}
	// The proxy injects the configured header, only for the secret's host;
	// the placeholder anywhere else stays a placeholder (a server echoing
	// that header back must not hand the secret to the sandbox).
	s.installFetch(id, inet)
	got, ok := s.fetchTLS(id, "https://secret.test/", "X-Key: $TOKEN")
	if !ok || !strings.Contains(got, "auth=real") || !strings.Contains(got, "xkey=placeholder") {
		t.Errorf("secret.test saw %q, want auth=real xkey=placeholder", got)
	}
	got, ok = s.fetchTLS(id, "https://good.test/", "X-Key: $TOKEN")
	if !ok || !strings.Contains(got, "auth=none") || !strings.Contains(got, "xkey=placeholder") {
		t.Errorf("good.test saw %q, want auth=none xkey=placeholder", got)
	}
	if _, ok := s.waitLog(id, func(e egressEntry) bool { return e.Host == "secret.test" && e.Intercepted }); !ok {
		t.Errorf("no intercepted secret.test entry in the log: %+v", s.netLog(id))
	}

	// The value is nowhere on the sandbox's disk or in its files; a marker
	// written the same way is found, so the search itself works.
	marker := "marker-" + hex.EncodeToString([]byte(id))
	s.must("exec", id, "--", "sh", "-c", "set -e; echo "+marker+" > /home/user/marker; env > /home/user/env.txt; sync")
	s.must("pause", id, "--mode", "memory") // falls back to disk where memory checkpoints are unavailable
	wantMemoryPause(t, s, id, "runc")
	syscall.Sync()
	dir := filepath.Join(s.dataDir, "sandboxes", id)
	img, err := os.ReadFile(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(img, []byte(marker)) {
		t.Fatalf("marker not found in disk.img: the search does not work")
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, []byte(testToken)) {
			t.Errorf("the secret's value is in %s", p)
		}
		return nil
	})
	db, _ := os.ReadFile(filepath.Join(s.dataDir, "berth.db"))
	if bytes.Contains(db, []byte(testToken)) {
		t.Errorf("the secret's value is in the store unsealed")
	}
	s.must("resume", id)
	if got, ok := s.fetchTLS(id, "https://secret.test/"); !ok || !strings.Contains(got, "auth=real") {
		t.Errorf("after pause/resume secret.test saw %q", got)
	}
}

func TestNetworkLogSurvivesRestart(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	id := s.create("--allow", "good.test")
	if out, ok := s.fetch(id, "http://good.test/"); !ok {
		t.Fatalf("good.test: %s", out)
	}
	s.fetch(id, "http://other.test/")
	if _, ok := s.waitLog(id, func(e egressEntry) bool { return e.Host == "good.test" && e.Proto == "tcp" }); !ok {
		t.Fatalf("no good.test entry: %+v", s.netLog(id))
	}
	before := s.netLog(id)

	s.kill9()
	s.start()
	after := s.netLog(id)
	if len(after) < len(before) {
		t.Fatalf("log shrank across a restart: %d → %d entries", len(before), len(after))
	}
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("entry %d changed across the restart: %+v → %+v", i, before[i], after[i])
		}
	}
	// The policy was re-registered with the new proxy.
	if out, ok := s.fetch(id, "http://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
		t.Errorf("good.test after restart: %q", out)
	}
	if out, ok := s.fetch(id, "http://other.test/"); ok {
		t.Errorf("other.test after restart: %s", out)
	}
}

func TestPortExposure(t *testing.T) {
	s := startServer(t)
	id := s.create()
	s.must("exec", id, "--", "sh", "-c", "set -e; mkdir -p /tmp/srv; echo hello-from-sandbox > /tmp/srv/index.html; httpd -p 8080 -h /tmp/srv")
	get := func(url string, hdr ...string) (int, string) {
		req, _ := http.NewRequest("GET", url, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	base := s.url + "/v1/sandboxes/" + id + "/ports/8080/index.html"
	if code, _ := get(base, "X-API-Key", s.key); code != http.StatusNotFound {
		t.Errorf("unexposed port: HTTP %d, want 404", code)
	}
	u := s.must("port", id, "8080")
	if !strings.HasPrefix(u, s.url+"/v1/sandboxes/"+id+"/ports/8080/") {
		t.Fatalf("port URL %q", u)
	}
	if code, body := get(u+"index.html", "X-API-Key", s.key); code != 200 || !strings.Contains(body, "hello-from-sandbox") {
		t.Errorf("with the owner's key: HTTP %d %q", code, body)
	}
	if code, _ := get(u + "index.html"); code != http.StatusUnauthorized {
		t.Errorf("without credentials: HTTP %d, want 401", code)
	}
	other := strings.TrimSpace(s.must("key", "create", "--owner", "mallory"))
	other = other[strings.LastIndex(other, " ")+1:]
	if code, _ := get(u+"index.html", "X-API-Key", other); code != http.StatusForbidden {
		t.Errorf("another owner's key: HTTP %d, want 403", code)
	}
	if code, _ := get(s.url+"/v1/sandboxes/"+id+"/ports/8081/", "X-API-Key", s.key); code != http.StatusNotFound {
		t.Errorf("port 8081 never exposed: HTTP %d, want 404", code)
	}

	tu := s.must("port", id, "8080", "--token")
	if !strings.Contains(tu, "?token=bpt_") {
		t.Fatalf("token URL %q", tu)
	}
	tokURL := strings.Replace(tu, "/?token=", "/index.html?token=", 1)
	if code, body := get(tokURL); code != 200 || !strings.Contains(body, "hello-from-sandbox") {
		t.Errorf("with the token: HTTP %d %q", code, body)
	}
	if code, _ := get(strings.Replace(tokURL, "token=bpt_", "token=bpt_x", 1)); code != http.StatusForbidden {
		t.Errorf("wrong token: HTTP %d, want 403", code)
	}
	tok := tu[strings.Index(tu, "token=")+len("token="):]
	if code, _ := get(u+"index.html", "X-Berth-Port-Token", tok); code != 200 {
		t.Errorf("token in a header: HTTP %d", code)
	}
	s.must("port", id, "8080", "--close")
	if code, _ := get(tokURL); code != http.StatusNotFound {
		t.Errorf("closed port: HTTP %d, want 404", code)
	}
}
