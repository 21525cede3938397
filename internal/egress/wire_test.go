package egress

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"golang.org/x/net/dns/dnsmessage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDNSCodec(t *testing.T) {
	// A query for "Example.Test" type A with RD set, as a stub resolver sends it.
	query := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0,
		7, 'E', 'x', 'a', 'm', 'p', 'l', 'e', 4, 'T', 'e', 's', 't', 0, 0, 1, 0, 1}
	q, err := parseDNSQuery(query)
	if err != nil {
		t.Fatal(err)
	}
	if q.name != "example.test" || q.q.Type != dnsmessage.TypeA || q.hdr.ID != 0x1234 || !q.hdr.RecursionDesired {
		t.Fatalf("parsed %+v", q)
	}
	resp := dnsResponse(q, true, dnsmessage.RCodeSuccess, []netip.Addr{netip.MustParseAddr("203.0.113.10")})
	if got := binary.BigEndian.Uint16(resp[6:]); got != 1 {
		t.Fatalf("ancount = %d", got)
	}
	if resp[2]&0x80 == 0 || resp[3]&0x0f != 0 || resp[2]&0x01 == 0 || resp[3]&0x80 == 0 {
		t.Fatalf("flags %x %x: want QR, RD echoed, RA, NOERROR", resp[2], resp[3])
	}
	// The question is echoed byte for byte (case too: DNS 0x20), the answer
	// names it by a pointer, and carries the address.
	if !bytes.Equal(resp[12:len(query)], query[12:]) {
		t.Fatalf("question echoed as %x, sent %x", resp[12:len(query)], query[12:])
	}
	if want := []byte{0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 203, 0, 113, 10}; !bytes.Equal(resp[len(query):], want) {
		t.Fatalf("answer %x, want %x", resp[len(query):], want)
	}
	// Over UDP a long reply keeps its question, loses its records and says TC.
	tr := truncate(resp)
	if !bytes.Equal(tr[12:], query[12:]) || tr[2]&0x02 == 0 || binary.BigEndian.Uint16(tr[6:]) != 0 {
		t.Fatalf("truncate = %x", tr)
	}

	for _, bad := range []struct {
		name string
		msg  []byte
	}{
		{"truncated question", query[:20]},
		{"a response", append([]byte{0x12, 0x34, 0x81, 0x00}, query[4:]...)},
		{"no question", append([]byte{0x12, 0x34, 0x01, 0x00, 0, 0}, query[6:]...)},
		{"two questions", append([]byte{0x12, 0x34, 0x01, 0x00, 0, 2}, query[6:]...)},
		// One label "good.test" must not read as the name good.test.
		{"dot inside a label", []byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 9, 'g', 'o', 'o', 'd', '.', 't', 'e', 's', 't', 0, 0, 1, 0, 1}},
		{"pointer loop", []byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}},
		{"name over 255 bytes", longName()},
	} {
		if q, err := parseDNSQuery(bad.msg); err == nil {
			t.Errorf("%s: parsed as %q", bad.name, q.name)
		}
	}
}

// longName is a query whose name has 5 labels of 63 bytes (319 bytes).
func longName() []byte {
	q := []byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	for range 5 {
		q = append(q, 63)
		q = append(q, bytes.Repeat([]byte{'a'}, 63)...)
	}
	return append(q, 0, 0, 1, 0, 1)
}

func TestPeek(t *testing.T) {
	tests := []struct {
		name     string
		send     func(c net.Conn)
		wantTLS  bool
		wantHTTP bool
		host     string
	}{
		{"tls sni", func(c net.Conn) {
			_ = tls.Client(c, &tls.Config{ServerName: "api.example.test"}).Handshake()
		}, true, false, "api.example.test"},
		{"http host", func(c net.Conn) {
			_, _ = c.Write([]byte("GET /x HTTP/1.1\r\nHost: web.example.test:8080\r\n\r\n"))
		}, false, true, "web.example.test"},
		{"garbage", func(c net.Conn) { _, _ = c.Write([]byte("SSH-2.0-OpenSSH\r\n")) }, false, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			done := make(chan struct{})
			go func() { defer close(done); tc.send(a) }()
			_ = b.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			isTLS, isHTTP, host, head := peek(b)
			b.Close()
			a.Close()
			<-done
			if isTLS != tc.wantTLS || isHTTP != tc.wantHTTP || host != tc.host || len(head) == 0 {
				t.Errorf("peek = tls %v http %v %q (%d bytes), want %v %v %q", isTLS, isHTTP, host, len(head), tc.wantTLS, tc.wantHTTP, tc.host)
			}
		})
	}
}

func TestInjectGrants(t *testing.T) {
	g := Grant{Name: "GH", Host: "api.github.test", HeaderTemplate: "Authorization: Bearer {{value}}",
		Value: "real-token", Placeholder: NewPlaceholder("GH")}
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("/repos/" + g.Placeholder + "?token=" + g.Placeholder)
	req := &http.Request{URL: u, Header: http.Header{
		"Authorization": {"token " + g.Placeholder},
		"X-Other":       {"a " + g.Placeholder + " b"},
	}}
	injectGrants(req, []Grant{g})
	// Only the configured header carries the value: a server that echoes
	// the path, the query or another header must see the placeholder.
	want := http.Header{"Authorization": {"Bearer real-token"}, "X-Other": {"a " + g.Placeholder + " b"}}
	if diff := cmp.Diff(want, req.Header); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	if req.URL.RawQuery != "token="+g.Placeholder || req.URL.Path != "/repos/"+g.Placeholder {
		t.Errorf("path %q query %q: the placeholder was replaced", req.URL.Path, req.URL.RawQuery)
	}
	for _, bad := range []Grant{{}, {Name: "X", Host: "h.test", HeaderTemplate: "Bearer {{value}}", Placeholder: g.Placeholder}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil", bad)
		}
	}
}

func TestCAAndSealer(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil || !bytes.Equal(ca.PEM(), again.PEM()) {
		t.Fatalf("CA not persisted: %v", err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "ca-key.pem")); st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v", st.Mode())
	}
	leaf, err := ca.Certificate("api.github.test")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.github.test"}); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}

	s, err := LoadOrCreateSealer(dir)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := s.Seal([]byte("hunter2"), []byte("owner/GH"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(ct, []byte("hunter2")) {
		t.Fatal("plaintext in ciphertext")
	}
	s2, _ := LoadOrCreateSealer(dir)
	pt, err := s2.Open(ct, []byte("owner/GH"))
	if err != nil || string(pt) != "hunter2" {
		t.Fatalf("open = %q, %v", pt, err)
	}
	if _, err := s2.Open(ct, []byte("other/GH")); err == nil {
		t.Error("opened with the wrong aad")
	}
}
