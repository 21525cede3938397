package egress

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/berth-dev/berth/internal/testutil"
)

// Everything here decodes what a sandbox sends: its DNS packets, the first
// bytes of its connections, its HTTP requests; and what a tenant sends as a
// policy. `scripts/fuzz.sh` runs each target for a bounded time.

// dnsQuery builds a wire query for name and qtype, as a stub resolver does.
func dnsQuery(id uint16, name string, qtype uint16) []byte {
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0)
	for _, l := range strings.Split(name, ".") {
		q = append(q, byte(len(l)))
		q = append(q, l...)
	}
	q = append(q, 0)
	q = binary.BigEndian.AppendUint16(q, qtype)
	return binary.BigEndian.AppendUint16(q, uint16(dnsmessage.ClassINET))
}

// FuzzAnswerDNS feeds any packet to the resolver of a sandbox whose policy
// allows one name. Whatever the packet, the reply is a well-formed answer
// to it (or nothing), and no name but the allowed one is ever asked
// upstream (DNS exfiltration).
func FuzzAnswerDNS(f *testing.F) {
	up := testutil.StartDNSServer(f, netip.MustParseAddr("203.0.113.9"))
	hosts := filepath.Join(f.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("203.0.113.10 good.test\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	px, err := New(Config{ProxyAddr: netip.MustParseAddrPort("127.0.0.1:1"), DNSAddr: netip.MustParseAddrPort("127.0.0.1:1"),
		HostsFile: hosts, UpstreamDNS: up.Addr})
	if err != nil {
		f.Fatal(err)
	}
	src := netip.MustParseAddr("10.88.0.2")
	pol, err := ParsePolicy("rules", []string{"good.test", "up.test", "198.51.100.0/24"}, []string{"*.bad.test"})
	if err != nil {
		f.Fatal(err)
	}
	if err := px.SetSandbox("fz", src, pol); err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{
		dnsQuery(0x1234, "good.test", uint16(dnsmessage.TypeA)),
		dnsQuery(1, "GOOD.Test", uint16(dnsmessage.TypeAAAA)),
		dnsQuery(2, "c2VjcmV0.exfil.example", uint16(dnsmessage.TypeA)),
		dnsQuery(3, "x.bad.test", uint16(dnsmessage.TypeA)),
		dnsQuery(4, "good.test", 16),                                           // TXT
		append(dnsQuery(5, "good.test", uint16(dnsmessage.TypeA)), 0, 0, 0, 0), // trailing bytes
		{0x12, 0x34, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0},                       // a response, not a query
		{0, 0, 0x78, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1},                 // opcode 15
		{0xc0, 0x0c},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		resp := px.answerDNS(t.Context(), src, msg)
		if resp == nil {
			return
		}
		if len(resp) < 12 || !bytes.Equal(resp[:2], msg[:2]) || resp[2]&0x80 == 0 {
			t.Fatalf("reply %x to %x is not an answer to it", resp, msg)
		}
		if int(binary.BigEndian.Uint16(resp[6:]))*16 > len(resp) {
			t.Fatalf("reply %x claims more answers than it holds", resp)
		}
		// Well-formed: every section the header claims is there and reads.
		var p dnsmessage.Parser
		h, err := p.Start(resp)
		if err != nil || h.ID != binary.BigEndian.Uint16(msg) || !h.Response {
			t.Fatalf("reply %x to %x: header %+v, %v", resp, msg, h, err)
		}
		qs, err := p.AllQuestions()
		if err != nil {
			t.Fatalf("reply %x: questions: %v", resp, err)
		}
		if _, err := p.AllAnswers(); err != nil {
			t.Fatalf("reply %x: answers: %v", resp, err)
		}
		// A question is echoed exactly as asked (case included) or not at all.
		if q, err := parseDNSQuery(msg); err == nil && len(qs) > 0 && qs[0] != q.q {
			t.Fatalf("reply to %x echoes question %+v, want %+v", msg, qs[0], q.q)
		}
		if tr := truncate(resp); len(tr) > len(resp) || len(tr) < 12 || tr[2]&0x02 == 0 {
			t.Fatalf("truncate(%x) = %x", resp, tr)
		}
		if n := up.Total(""); n != up.Count("up.test") {
			t.Fatalf("a name other than up.test was asked upstream (%d queries in all)", n)
		}
	})
}

// FuzzPeek: whatever a sandbox sends first, peek returns a prefix of it to
// replay, and claims TLS only for a handshake record.
func FuzzPeek(f *testing.F) {
	f.Add([]byte("GET /x HTTP/1.1\r\nHost: web.example.test:8080\r\n\r\n"))
	f.Add([]byte("GET http://other.test/ HTTP/1.1\r\nHost: good.test\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n"))
	f.Add([]byte("SSH-2.0-OpenSSH\r\n"))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		var wg sync.WaitGroup
		wg.Go(func() {
			_, _ = a.Write(data)
			a.Close()
		})
		_ = b.SetReadDeadline(time.Now().Add(time.Second))
		isTLS, isHTTP, host, head := peek(b)
		b.Close()
		wg.Wait()
		if !bytes.HasPrefix(data, head) {
			t.Fatalf("head %q is not a prefix of what was sent", head)
		}
		if isTLS && (isHTTP || len(data) == 0 || data[0] != 0x16) {
			t.Fatalf("peek(%q) = tls %v http %v", data, isTLS, isHTTP)
		}
		if isHTTP && strings.ContainsAny(host, " \r\n/") {
			t.Fatalf("peek(%q) host %q", data, host)
		}
	})
}

// FuzzRelayHTTPHost sends any byte stream through the plain-HTTP relay of a
// connection decided for good.test, to a real upstream server: the upstream
// must never see a request for another Host (keep-alive smuggling, absolute
// URIs, odd Host forms).
func FuzzRelayHTTPHost(f *testing.F) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Host)
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	f.Cleanup(srv.Close)
	px, err := New(Config{ProxyAddr: netip.MustParseAddrPort("127.0.0.1:1"), DNSAddr: netip.MustParseAddrPort("127.0.0.1:1")})
	if err != nil {
		f.Fatal(err)
	}
	src := netip.MustParseAddr("10.88.0.2")
	pol, _ := ParsePolicy("allow-all", nil, []string{"other.test"})
	if err := px.SetSandbox("fz", src, pol); err != nil {
		f.Fatal(err)
	}
	st := px.byID["fz"]
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ln.Close() })
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: good.test\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: good.test\r\n\r\nGET http://evil.test/ HTTP/1.1\r\nHost: good.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: good.test\r\n\r\nGET / HTTP/1.1\r\nHost: GOOD.test.:80\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: good.test\r\nContent-Length: 40\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: good.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		mu.Lock()
		seen = nil
		mu.Unlock()
		// The sandbox side: a real TCP pair, half-closed after the data.
		sandbox, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer sandbox.Close()
		client, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		upc, err := net.Dial("tcp4", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		up := upc.(*net.TCPConn)
		defer up.Close()
		var wg sync.WaitGroup
		wg.Go(func() {
			_, _ = sandbox.Write(data)
			_ = sandbox.(*net.TCPConn).CloseWrite()
			_, _ = io.Copy(io.Discard, sandbox)
		})
		_ = client.SetDeadline(time.Now().Add(2 * time.Second))
		_ = up.SetDeadline(time.Now().Add(2 * time.Second))
		_, _, _ = px.relayHTTP(st, Query{IP: netip.MustParseAddr("198.51.100.1"), Port: 80}, "good.test", client, up)
		client.Close()
		up.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, h := range seen {
			if hh, _, err := net.SplitHostPort(h); err == nil {
				h = hh
			}
			if normalizeHost(h) != "good.test" {
				t.Fatalf("upstream saw Host %q on a connection decided for good.test (sent %q)", h, data)
			}
		}
	})
}

// FuzzParseRule: every rule ParseRule accepts prints back to itself.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"api.github.com:443", "*.pypi.org", "10.0.0.0/8", "10.1.2.3/8:443", "[2001:db8::1]:443",
		"2001:db8::/32", "::ffff:1.2.3.4", "fe80::1%eth0", "EXAMPLE.com.", "a_b.test", "*.", "1.2.3.4:0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		again, err := ParseRule(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRule(%q) = %v, but its text %q reads back as %v, %v", s, r, r.String(), again, err)
		}
		pol := Policy{Mode: Rules, Allow: []Rule{r}}
		_ = CheckRanges(pol, nil)
		_ = Decide(pol, Query{IP: netip.MustParseAddr("203.0.113.1"), Port: 443, Host: "api.github.com"})
	})
}

// FuzzUnmarshalPolicy: a stored or sent policy that decodes validates and
// survives a round trip unchanged.
func FuzzUnmarshalPolicy(f *testing.F) {
	for _, s := range []string{`{"mode":"rules","allow":["api.github.com:443","*.pypi.org","10.0.0.0/8"],"deny":["1.2.3.4"]}`,
		`{"mode":"deny-all"}`, `{"mode":"allow-all","deny":["*.evil.test"]}`, `{"mode":"deny-all","allow":["x.test"]}`, `{"mode":"open"}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := UnmarshalPolicy(b)
		if err != nil {
			return
		}
		out, err := MarshalPolicy(p)
		if err != nil {
			t.Fatalf("decoded policy %+v does not marshal: %v", p, err)
		}
		again, err := UnmarshalPolicy(out)
		if err != nil {
			t.Fatalf("round trip of %s: %v", out, err)
		}
		if d := cmp.Diff(p, again, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
			t.Fatalf("round trip changed the policy (-first +again):\n%s", d)
		}
	})
}
