package network

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
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
// while another is attached, and its Detach outside the clock.
func BenchmarkAttach(b *testing.B) {
	e := newEnv(b)
	e.attach("benchother", policy(b, "deny-all", nil, nil))
	ctx := context.Background()
	for b.Loop() {
		if _, err := e.mgr.Attach(ctx, "benchone", policy(b, "deny-all", nil, nil)); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		must(b, e.mgr.Detach(ctx, "benchone"))
		b.StartTimer()
	}
}
