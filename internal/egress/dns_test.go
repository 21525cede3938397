package egress

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/berth-dev/berth/internal/testutil"
)

// dnsProxy runs a real Proxy on loopback whose upstream is a counting test
// resolver; sandboxes are identified by their loopback source address
// (127.0.0.1, 127.0.0.2, ...), as they are by their veth address in production.
type dnsProxy struct {
	px       *Proxy
	upstream *testutil.DNSServer
	dns      netip.AddrPort

	mu     sync.Mutex
	limits []string // "sandbox:limit"
	log    []Decision
}

func startDNSProxy(t *testing.T, cfg Config) *dnsProxy {
	t.Helper()
	e := &dnsProxy{upstream: testutil.StartDNSServer(t, netip.MustParseAddr("203.0.113.7"))}
	e.upstream.SetSlow(".slow.test", 1500*time.Millisecond)
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("203.0.113.10 good.test\n192.168.5.5 inside.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.ProxyAddr = netip.MustParseAddrPort("127.0.0.1:0")
	cfg.DNSAddr = freeUDPPort(t)
	cfg.HostsFile = hosts
	cfg.UpstreamDNS = e.upstream.Addr
	cfg.OnLimit = func(id, limit string, _ int) {
		e.mu.Lock()
		e.limits = append(e.limits, id+":"+limit)
		e.mu.Unlock()
	}
	cfg.Sink = func(d Decision) {
		e.mu.Lock()
		e.log = append(e.log, d)
		e.mu.Unlock()
	}
	px, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.px, e.dns = px, cfg.DNSAddr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- px.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	if err := px.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *dnsProxy) limitsHit() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.limits...)
}

func freeUDPPort(t *testing.T) netip.AddrPort {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ap := netip.MustParseAddrPort(pc.LocalAddr().String())
		pc.Close()
		if ln, err := net.Listen("tcp4", ap.String()); err == nil {
			ln.Close()
			return ap
		}
	}
	t.Fatal("no free port")
	return netip.AddrPort{}
}

// ask sends one A query for name from src and returns the rcode and the
// number of answers; rcode -1 means no reply within timeout.
func (e *dnsProxy) ask(t *testing.T, src, name string, timeout time.Duration) (rcode, answers int) {
	t.Helper()
	c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(src), 0)), net.UDPAddrFromAddrPort(e.dns))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := []byte{0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, l := range strings.Split(name, ".") {
		q = append(q, byte(len(l)))
		q = append(q, l...)
	}
	q = append(q, 0, 0, 1, 0, 1)
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil || n < 12 {
		return -1, 0
	}
	return int(buf[3] & 0xf), int(binary.BigEndian.Uint16(buf[6:]))
}

func TestDNSDeniedNameNeverAskedUpstream(t *testing.T) {
	e := startDNSProxy(t, Config{})
	// Hostname and CIDR rules: the CIDR rule must not make other names resolvable.
	must(t, e.px.SetSandbox("a", netip.MustParseAddr("127.0.0.1"), mustPolicy(t, Rules, []string{"*.up.test", "203.0.113.0/24"}, nil)))
	must(t, e.px.SetSandbox("b", netip.MustParseAddr("127.0.0.2"), mustPolicy(t, AllowAll, nil, []string{"*.blocked.test"})))

	for _, name := range []string{"c2VjcmV0.exfil.test", "x.blocked.test"} {
		src := "127.0.0.1"
		if strings.HasSuffix(name, ".blocked.test") {
			src = "127.0.0.2"
		}
		if rcode, n := e.ask(t, src, name, 2*time.Second); rcode == int(dnsmessage.RCodeSuccess) || n != 0 {
			t.Errorf("%s from %s: rcode %d, %d answers; want a refusal", name, src, rcode, n)
		}
		if got := e.upstream.Count(name); got != 0 {
			t.Errorf("%s was asked upstream %d times; a refused name must never leave the host", name, got)
		}
	}
	// The control: allowed names are asked upstream and answered.
	if rcode, n := e.ask(t, "127.0.0.1", "api.up.test", 3*time.Second); rcode != int(dnsmessage.RCodeSuccess) || n != 1 {
		t.Errorf("api.up.test: rcode %d, %d answers", rcode, n)
	}
	if rcode, n := e.ask(t, "127.0.0.2", "anything.example", 3*time.Second); rcode != int(dnsmessage.RCodeSuccess) || n != 1 {
		t.Errorf("anything.example under allow-all: rcode %d, %d answers", rcode, n)
	}
	if e.upstream.Count("api.up.test") == 0 || e.upstream.Count("anything.example") == 0 {
		t.Errorf("allowed names were not asked upstream: the counter does not work")
	}
}

func TestDNSPrivateAnswerNeedsServerSetting(t *testing.T) {
	for _, tc := range []struct {
		open []netip.Prefix
		want int
	}{{nil, int(dnsmessage.RCodeRefused)}, {[]netip.Prefix{netip.MustParsePrefix("192.168.5.0/24")}, int(dnsmessage.RCodeSuccess)}} {
		e := startDNSProxy(t, Config{AllowPrivate: tc.open})
		// The tenant's own CIDR rule for the range does not count.
		must(t, e.px.SetSandbox("a", netip.MustParseAddr("127.0.0.1"), mustPolicy(t, Rules, []string{"inside.test", "192.168.5.0/24"}, nil)))
		if rcode, _ := e.ask(t, "127.0.0.1", "inside.test", 2*time.Second); rcode != tc.want {
			t.Errorf("inside.test (192.168.5.5) with the server opening %v: rcode %d, want %d", tc.open, rcode, tc.want)
		}
		if tc.open == nil {
			found := false
			e.mu.Lock()
			for _, d := range e.log {
				found = found || (d.Host == "inside.test" && d.Rule == "dns-rebinding" && d.Verdict == "deny")
			}
			e.mu.Unlock()
			if !found {
				t.Errorf("no dns-rebinding entry in the egress log")
			}
		}
	}
}

func TestDNSPerSandboxCaps(t *testing.T) {
	e := startDNSProxy(t, Config{MaxDNSInFlight: 2, DNSQPS: 1000})
	must(t, e.px.SetSandbox("a", netip.MustParseAddr("127.0.0.1"), Policy{Mode: AllowAll}))
	must(t, e.px.SetSandbox("b", netip.MustParseAddr("127.0.0.2"), Policy{Mode: AllowAll}))
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() { e.ask(t, "127.0.0.1", "n"+string(rune('a'+i))+".slow.test", 3*time.Second) })
	}
	// While a's slow queries hold its slots, b is answered at once.
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if rcode, n := e.ask(t, "127.0.0.2", "quick.example", 2*time.Second); rcode != int(dnsmessage.RCodeSuccess) || n != 1 {
		t.Errorf("b during a's flood: rcode %d, %d answers", rcode, n)
	}
	if time.Since(start) > time.Second {
		t.Errorf("b waited %v behind a's flood", time.Since(start))
	}
	wg.Wait()
	if got := e.upstream.Total(".slow.test"); got > 4 { // A and AAAA per lookup
		t.Errorf("%d of a's queries went upstream at once; the in-flight cap is 2 lookups", got)
	}
	if hit := e.limitsHit(); !contains(hit, "a:dns_inflight") || contains(hit, "b:dns_inflight") {
		t.Errorf("limits hit = %v, want a:dns_inflight only", hit)
	}

	r := startDNSProxy(t, Config{DNSQPS: 5})
	must(t, r.px.SetSandbox("a", netip.MustParseAddr("127.0.0.1"), Policy{Mode: AllowAll}))
	var answered atomic.Int32
	for range 30 {
		wg.Go(func() {
			if rcode, _ := r.ask(t, "127.0.0.1", "fast.example", time.Second); rcode == int(dnsmessage.RCodeSuccess) {
				answered.Add(1)
			}
		})
	}
	wg.Wait()
	if answered.Load() > 15 || !contains(r.limitsHit(), "a:dns_rate") {
		t.Errorf("30 queries at once under a 5/s cap: %d answered, limits %v", answered.Load(), r.limitsHit())
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
