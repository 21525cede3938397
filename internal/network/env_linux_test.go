package network

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/testutil"
)

// The "internet" of these tests: one namespace the test creates, reached
// from the host over a veth, holding these addresses (TEST-NET-3).
const (
	inetHost  = "203.0.113.1/24"
	goodIP    = "203.0.113.10"
	otherIP   = "203.0.113.11"
	secretIP  = "203.0.113.12"
	testToken = "real-token-5f2b"
)

// hostsFile is what berth's resolver reads before the host's resolver; every
// name the tests use is here, so no query ever leaves the machine.
const hostsFile = `203.0.113.10 good.test a.wild.test
203.0.113.11 other.test
203.0.113.12 secret.test
192.168.77.7 rebind.test
127.0.0.1 local.test
`

// envSubnetBits is the size of the sandboxes' subnet of the next newEnv.
var envSubnetBits = 24

type env struct {
	t       testing.TB
	dir     string
	mgr     *Manager
	px      *egress.Proxy
	ca      *egress.CA
	testCA  string // PEM file of the CA that signed the "internet" servers
	inetNS  string
	cancel  context.CancelFunc
	runDone chan error

	mu  sync.Mutex
	log []egress.Decision
}

func newEnv(t testing.TB) *env {
	t.Helper()
	testutil.RequireRoot(t)
	for _, tool := range []string{"ip", "nft", "unshare", "nsenter", "curl", "getent"} {
		testutil.RequireTool(t, tool)
	}
	var rb [3]byte
	_, _ = rand.Read(rb[:])
	sfx := hex.EncodeToString(rb[:])
	e := &env{t: t, dir: t.TempDir(), runDone: make(chan error, 1)}

	e.inetNS = filepath.Join(e.dir, "inet")
	inetVeth := "bti" + sfx
	must(t, createNetns(context.Background(), e.inetNS))
	t.Cleanup(func() {
		_ = deleteLink(context.Background(), inetVeth)
		_ = deleteNetns(e.inetNS)
	})
	sh(t, "ip", "link", "add", inetVeth, "type", "veth", "peer", "name", "eth0", "netns", e.inetNS)
	sh(t, "ip", "addr", "add", inetHost, "dev", inetVeth)
	sh(t, "ip", "link", "set", inetVeth, "up")
	for _, cmd := range []string{"link set lo up", "addr add " + goodIP + "/24 dev eth0", "addr add " + otherIP + "/24 dev eth0",
		"addr add " + secretIP + "/24 dev eth0", "link set eth0 up", "route add default via 203.0.113.1"} {
		sh(t, append([]string{"nsenter", "--net=" + e.inetNS, "ip"}, strings.Fields(cmd)...)...)
	}
	e.startServers()

	hosts := filepath.Join(e.dir, "hosts")
	must(t, os.WriteFile(hosts, []byte(hostsFile), 0o644))
	ca, err := egress.LoadOrCreateCA(filepath.Join(e.dir, "ca"))
	must(t, err)
	e.ca = ca
	cfg := Config{
		BridgeName: "btb" + sfx,
		Subnet:     netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, rb[0], 0}), envSubnetBits).Masked(),
		StateDir:   filepath.Join(e.dir, "state"),
		Table:      "btt" + sfx,
		VethPrefix: "bx" + sfx[:2],
		ProxyPort:  15001,
		DNSPort:    10053,
	}
	e.px, err = egress.New(egress.Config{
		ProxyAddr: cfg.ProxyAddr(), DNSAddr: cfg.DNSAddr(), CA: ca, ExtraCAFile: e.testCA,
		HostsFile: hosts, Blocked: []netip.Prefix{cfg.Subnet}, PeekTimeout: 300 * time.Millisecond,
		Sink: func(d egress.Decision) { e.mu.Lock(); e.log = append(e.log, d); e.mu.Unlock() },
	})
	must(t, err)
	cfg.Egress = e.px
	e.mgr, err = New(cfg)
	must(t, err)
	must(t, e.mgr.Setup(context.Background()))
	t.Cleanup(func() {
		if err := e.mgr.Teardown(context.Background()); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { e.runDone <- e.px.Run(ctx) }()
	t.Cleanup(e.stopProxy)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	must(t, e.px.WaitReady(rctx))
	return e
}

func (e *env) stopProxy() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	e.cancel = nil
	if err := <-e.runDone; err != nil {
		e.t.Errorf("proxy Run: %v", err)
	}
}

// startServers runs an HTTP (:80) and an HTTPS (:443) server inside the
// "internet" namespace. They answer "host=<Host> auth=<Authorization>", and
// /bytes/N streams N bytes.
func (e *env) startServers() {
	t := e.t
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test internet"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"good.test", "other.test", "secret.test", "a.wild.test"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	e.testCA = filepath.Join(e.dir, "test-ca.pem")
	must(t, os.WriteFile(e.testCA, certPEM, 0o644))
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}

	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host=%s auth=%s", r.Host, r.Header.Get("Authorization"))
	})
	mux.HandleFunc("/bytes/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.PathValue("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		buf := make([]byte, 256<<10)
		for n > 0 {
			m := min(n, int64(len(buf)))
			if _, err := w.Write(buf[:m]); err != nil {
				return
			}
			n -= m
		}
	})
	var plain, secure net.Listener
	must(t, testutil.InNetns(e.inetNS, func() error {
		var err error
		if plain, err = net.Listen("tcp4", ":80"); err != nil {
			return err
		}
		secure, err = net.Listen("tcp4", ":443")
		return err
	}))
	srv := &http.Server{Handler: mux}
	tsrv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(plain) })
	wg.Go(func() { _ = tsrv.ServeTLS(secure, "", "") })
	t.Cleanup(func() {
		srv.Close()
		tsrv.Close()
		wg.Wait()
	})
}

// attach attaches a sandbox and writes what the daemon would write into its
// rootfs: resolv.conf, an /etc/hosts of its own, and berth's CA.
func (e *env) attach(id string, pol egress.Policy) Attachment {
	e.t.Helper()
	att, err := e.mgr.Attach(context.Background(), id, pol)
	must(e.t, err)
	root := filepath.Join(e.dir, "rootfs-"+id)
	must(e.t, os.MkdirAll(root, 0o755))
	must(e.t, os.WriteFile(filepath.Join(root, "resolv.conf"), []byte(att.ResolvConf), 0o644))
	must(e.t, os.WriteFile(filepath.Join(root, "hosts"), []byte("127.0.0.1 localhost\n"), 0o644))
	must(e.t, os.WriteFile(filepath.Join(root, "berth-ca.pem"), e.ca.PEM(), 0o644))
	return att
}

// inSandbox runs a command in the sandbox's network namespace with its own
// resolv.conf and hosts file (a private mount namespace), as a process of
// the sandbox would run. It returns stdout and the exit code.
func (e *env) inSandbox(id string, envv []string, args ...string) (string, int) {
	e.t.Helper()
	root := filepath.Join(e.dir, "rootfs-"+id)
	script := `mount --bind "$R/resolv.conf" /etc/resolv.conf && mount --bind "$R/hosts" /etc/hosts && exec "$@"`
	full := append([]string{"--net=" + filepath.Join(e.mgr.Config().StateDir, "netns", id),
		"unshare", "-m", "sh", "-c", script, "sh"}, args...)
	cmd := exec.Command("nsenter", full...)
	cmd.Env = append([]string{"R=" + root, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, envv...)
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	must(e.t, err)
	return string(out), 0
}

// curl fetches url from inside the sandbox, trusting the test CA and berth's CA.
func (e *env) curl(id string, envv []string, args ...string) (string, int) {
	e.t.Helper()
	bundle := filepath.Join(e.dir, "rootfs-"+id, "bundle.pem")
	if _, err := os.Stat(bundle); err != nil {
		test, _ := os.ReadFile(e.testCA)
		must(e.t, os.WriteFile(bundle, append(test, e.ca.PEM()...), 0o644))
	}
	base := []string{"curl", "-sS", "--max-time", "5", "--cacert", bundle}
	return e.inSandbox(id, envv, append(base, args...)...)
}

func (e *env) decisions() []egress.Decision {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]egress.Decision(nil), e.log...)
}

// waitDecision waits for a log entry matching f (allowed connections are
// logged when they close).
func (e *env) waitDecision(f func(egress.Decision) bool) (egress.Decision, bool) {
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, d := range e.decisions() {
			if f(d) {
				return d, true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return egress.Decision{}, false
}

func sh(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return string(out)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sandboxDialer dials from inside a namespace (for in-process clients).
func sandboxDialer(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := testutil.InNetns(nsPath, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, "tcp4", addr)
			return err
		})
		return c, err
	}
}
