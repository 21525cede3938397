package egress

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// relayPair runs relayHTTP for a connection decided for good.test between
// a "sandbox" TCP connection (returned) and a real upstream server.
func relayPair(t *testing.T, upstream http.Handler) (sandbox net.Conn, done <-chan error) {
	t.Helper()
	srv := httptest.NewServer(upstream)
	t.Cleanup(srv.Close)
	px, err := New(Config{ProxyAddr: netip.MustParseAddrPort("127.0.0.1:1"), DNSAddr: netip.MustParseAddrPort("127.0.0.1:1")})
	must(t, err)
	must(t, px.SetSandbox("rl", netip.MustParseAddr("10.88.0.2"), mustPolicy(t, Rules, []string{"good.test", "other.test"}, nil)))
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	sandbox, err = net.Dial("tcp4", ln.Addr().String())
	must(t, err)
	client, err := ln.Accept()
	must(t, err)
	upc, err := net.Dial("tcp4", srv.Listener.Addr().String())
	must(t, err)
	ch := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _, err := px.relayHTTP(px.byID["rl"], Query{IP: netip.MustParseAddr("198.51.100.1"), Port: 80}, "good.test",
			&prefixConn{Conn: client}, upc.(*net.TCPConn))
		client.Close()
		upc.Close()
		ch <- err
	})
	t.Cleanup(func() { sandbox.Close(); wg.Wait() })
	_ = sandbox.SetDeadline(time.Now().Add(5 * time.Second))
	return sandbox, ch
}

func TestRelayHTTPKeepAlive(t *testing.T) {
	var mu sync.Mutex
	var hosts []string
	sb, _ := relayPair(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Host+r.URL.Path)
		mu.Unlock()
		_, _ = io.WriteString(w, "ok "+r.URL.Path)
	}))
	br := bufio.NewReader(sb)
	get := func(host, target string) *http.Response {
		t.Helper()
		if _, err := io.WriteString(sb, "GET "+target+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if r := get("good.test", "/a"); r.StatusCode != 200 {
		t.Fatalf("first request: %d", r.StatusCode)
	}
	if r := get("GOOD.test:80", "http://good.test/b"); r.StatusCode != 200 {
		t.Fatalf("second request to the same host: %d", r.StatusCode)
	}
	// other.test is allowed by the policy, but not on good.test's connection.
	if r := get("other.test", "/c"); r.StatusCode != http.StatusForbidden || !r.Close {
		t.Fatalf("request for other.test on good.test's connection: %d (close %v)", r.StatusCode, r.Close)
	}
	mu.Lock()
	defer mu.Unlock()
	// An absolute target names the host (the Host header is ignored then).
	if strings.Join(hosts, " ") != "good.test/a good.test/b" {
		t.Errorf("upstream saw %v", hosts)
	}
}

func TestRelayHTTPUpgrade(t *testing.T) {
	sb, done := relayPair(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		line, _ := brw.ReadString('\n')
		_, _ = io.WriteString(c, "echo: "+line)
	}))
	// The raw bytes after the request head go through once upgraded, even
	// when sent in the same packet as the request.
	if _, err := io.WriteString(sb, "GET /ws HTTP/1.1\r\nHost: good.test\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nhello\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(sb)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	line, err := br.ReadString('\n')
	if err != nil || line != "echo: hello\n" {
		t.Fatalf("after the upgrade read %q, %v", line, err)
	}
	sb.(*net.TCPConn).CloseWrite()
	if err := <-done; err != nil {
		t.Errorf("relay: %v", err)
	}
}
