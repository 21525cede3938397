package network

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"testing"

	"github.com/berth-dev/berth/internal/egress"
)

// BenchmarkEgress measures what the proxy adds: one HTTPS request on a new
// connection (TLS handshake included), and a 100 MiB download, each from the
// host straight to the server ("direct") and from a sandbox through the
// proxy ("proxy"; "intercept" adds TLS termination and header injection).
func BenchmarkEgress(b *testing.B) {
	e := newEnv(b)
	att := e.attach("bench1", policy(b, "rules", []string{"good.test", "secret.test"}, nil))
	must(b, e.px.SetGrants("bench1", []egress.Grant{{Name: "T", Host: "secret.test",
		HeaderTemplate: "Authorization: Bearer {{value}}", Value: testToken, Placeholder: egress.NewPlaceholder("T")}}))

	pool := x509.NewCertPool()
	testPEM, err := os.ReadFile(e.testCA)
	must(b, err)
	pool.AppendCertsFromPEM(testPEM)
	pool.AppendCertsFromPEM(e.ca.PEM())
	ips := map[string]string{"good.test:443": goodIP + ":443", "secret.test:443": secretIP + ":443"}
	client := func(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
		return &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dial(ctx, network, ips[addr])
			},
			TLSClientConfig:   &tls.Config{RootCAs: pool},
			DisableKeepAlives: true,
		}}
	}
	var d net.Dialer
	direct := client(d.DialContext)
	proxied := client(sandboxDialer(att.NetNSPath))
	get := func(b *testing.B, c *http.Client, url string) int64 {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("%s: %d %v", url, resp.StatusCode, err)
		}
		return n
	}
	for _, bc := range []struct {
		name   string
		client *http.Client
		url    string
		bytes  int64
	}{
		{"latency/direct", direct, "https://good.test/", 0},
		{"latency/proxy", proxied, "https://good.test/", 0},
		{"latency/intercept", proxied, "https://secret.test/", 0},
		{"download100MiB/direct", direct, "https://good.test/bytes/104857600", 100 << 20},
		{"download100MiB/proxy", proxied, "https://good.test/bytes/104857600", 100 << 20},
		{"download100MiB/intercept", proxied, "https://secret.test/bytes/104857600", 100 << 20},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.bytes > 0 {
				b.SetBytes(bc.bytes)
			}
			for b.Loop() {
				if n := get(b, bc.client, bc.url); bc.bytes > 0 && n != bc.bytes {
					b.Fatalf("got %d bytes", n)
				}
			}
		})
	}
}

// BenchmarkAttach measures the network phase of a cold create: Attach
// (namespace, veth on the bridge, address, route, ruleset) of one sandbox
// beside N others, and its Detach outside the clock. The others are
// records in the ruleset only (no namespace or veth: the ruleset is what
// grows with them); BenchmarkDetach is the same with the clocks swapped.
func BenchmarkAttach(b *testing.B) { benchAttachDetach(b, true) }

// BenchmarkDetach: see BenchmarkAttach.
func BenchmarkDetach(b *testing.B) { benchAttachDetach(b, false) }

func benchAttachDetach(b *testing.B, attach bool) {
	envSubnetBits = 20 // room for 1,000 others
	defer func() { envSubnetBits = 24 }()
	e := newEnv(b)
	ctx := context.Background()
	have := 0
	for _, n := range []int{0, 100, 1000} {
		seedRuleset(b, e.mgr, have, n)
		have = n
		b.Run(fmt.Sprintf("others=%d", n), func(b *testing.B) {
			for b.Loop() {
				if !attach {
					b.StopTimer()
				}
				if _, err := e.mgr.Attach(ctx, "benchone", policy(b, "deny-all", nil, nil)); err != nil {
					b.Fatal(err)
				}
				if attach {
					b.StopTimer()
				} else {
					b.StartTimer()
				}
				must(b, e.mgr.Detach(ctx, "benchone"))
				if attach {
					b.StartTimer()
				}
			}
		})
	}
}

// seedRuleset adds sandboxes from..to-1 to the manager's state as records
// only and loads the whole ruleset with them.
func seedRuleset(b *testing.B, m *Manager, from, to int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	base := m.cfg.Subnet.Addr().As4()
	for i := from; i < to; i++ {
		v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3]) + uint32(i) + 2
		ip := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		id := fmt.Sprintf("seed%05d", i)
		m.sbs[id] = &record{IP: ip, Veth: m.vethName(id), Policy: egress.Policy{Mode: egress.AllowAll}}
	}
	must(b, seedLoad(m))
}
