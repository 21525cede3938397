package sandboxca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLoadOrCreateFilesAndReload(t *testing.T) {
	dir := filepath.Join(t.TempDir(), DirName)
	ca, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"": 0o700, KeyFile: 0o600, CertFile: 0o644} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got != want {
			t.Errorf("%q mode = %o, want %o", name, got, want)
		}
	}
	if !ca.Certificate().IsCA {
		t.Fatal("CA certificate is not a CA")
	}
	again, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if string(again.CertPEM()) != string(ca.CertPEM()) {
		t.Fatal("second LoadOrCreate made a new CA instead of loading the first")
	}
	// One file without the other is refused, not replaced.
	if err := os.Remove(filepath.Join(dir, CertFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(dir); err == nil {
		t.Fatal("a key without a certificate was accepted")
	}
}

func TestIssuerCovers(t *testing.T) {
	ca, err := LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	is, err := NewIssuer(ca, "Berth.Localhost.")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"49983-abc.berth.localhost":     true,
		"3000-i1x.BERTH.localhost":      true,
		"api.berth.localhost":           true,
		"berth.localhost":               true,
		"a.b.berth.localhost":           false, // two labels deep
		"evil.example.com":              false,
		"berth.localhost.evil.com":      false,
		"xberth.localhost":              false,
		".berth.localhost":              false,
		"-x.berth.localhost":            false,
		"a_b.berth.localhost":           false,
		"":                              false,
		"localhost":                     false,
		"*.berth.localhost":             false,
		"49983-abc.berth.localhost:443": false,
	} {
		if got := is.Covers(name); got != want {
			t.Errorf("Covers(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestNormalizeDomain(t *testing.T) {
	for in, ok := range map[string]bool{
		"berth.localhost": true, "localhost": true, "a-b.example": true,
		"": false, "-a.example": false, "a..b": false, "a b": false, "a/b": false, "*.x": false,
	} {
		_, err := NormalizeDomain(in)
		if (err == nil) != ok {
			t.Errorf("NormalizeDomain(%q) err = %v, want ok=%v", in, err, ok)
		}
	}
}

func TestLeafIssuanceAndCache(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	ca, err := loadOrCreate(t.TempDir(), clock)
	if err != nil {
		t.Fatal(err)
	}
	is, err := NewIssuer(ca, "berth.localhost")
	if err != nil {
		t.Fatal(err)
	}
	name := "8000-abc123.berth.localhost"
	c, err := is.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
	if err != nil {
		t.Fatal(err)
	}
	leaf := c.Leaf
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Fatalf("leaf key is %T, want ECDSA P-256", leaf.PublicKey)
	}
	if got := leaf.NotAfter.Sub(now); got > leafLifetime || got < leafLifetime-time.Minute {
		t.Fatalf("leaf lives %s, want %s", got, leafLifetime)
	}
	if leaf.IsCA || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != name {
		t.Fatalf("leaf IsCA=%v DNSNames=%v", leaf.IsCA, leaf.DNSNames)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: now}); err != nil {
		t.Fatalf("leaf does not verify against the CA: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "8000-other.berth.localhost", Roots: pool, CurrentTime: now}); err == nil {
		t.Fatal("leaf verifies for another name")
	}
	// Cached until two thirds of its life, then renewed.
	c2, _ := is.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
	if c2 != c {
		t.Fatal("second handshake issued a new leaf instead of the cached one")
	}
	now = now.Add(leafLifetime * 3 / 4)
	c3, err := is.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
	if err != nil {
		t.Fatal(err)
	}
	if c3 == c || !c3.Leaf.NotAfter.After(leaf.NotAfter) {
		t.Fatal("leaf past two thirds of its life was not renewed")
	}
	for _, bad := range []string{"", "evil.example.com", "a.b.berth.localhost", "berth.localhost.evil"} {
		if c, err := is.GetCertificate(&tls.ClientHelloInfo{ServerName: bad}); err == nil || c != nil {
			t.Errorf("GetCertificate(%q) issued a certificate", bad)
		}
	}
}

// TestSNISelection runs a real TLS listener with the issuer: a client
// trusting only the CA connects to a covered name, and a handshake for a
// name outside the domain fails.
func TestSNISelection(t *testing.T) {
	ca, err := LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	is, err := NewIssuer(ca, "berth.localhost")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", is.TLSConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = io.WriteString(c, "ok")
			}()
		}
	}()
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	dial := func(name string) (*tls.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(),
			&tls.Config{ServerName: name, RootCAs: pool})
	}
	for _, name := range []string{"49983-abc.berth.localhost", "3000-abc.berth.localhost"} {
		c, err := dial(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := c.ConnectionState().PeerCertificates[0].DNSNames; len(got) != 1 || got[0] != name {
			t.Errorf("%s: served certificate for %v", name, got)
		}
		c.Close()
	}
	if c, err := dial("www.example.com"); err == nil {
		c.Close()
		t.Fatal("handshake for a name outside the domain succeeded")
	}
}

func TestStaticCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreate(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	// An "operator" certificate: any key pair on disk.
	src, _ := NewIssuer(ca, "ops.example")
	c, err := src.GetCertificate(&tls.ClientHelloInfo{ServerName: "x.ops.example"})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	writePEM(t, certFile, keyFile, c)
	is, err := Static("ops.example", certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := is.GetCertificate(&tls.ClientHelloInfo{ServerName: "3000-abc.ops.example"})
	if err != nil || got == nil {
		t.Fatalf("static: %v", err)
	}
	if _, err := is.GetCertificate(&tls.ClientHelloInfo{ServerName: "evil.example"}); err == nil {
		t.Fatal("static issuer served a name outside its domain")
	}
	if _, err := Static("ops.example", certFile, filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing key file was accepted")
	}
}
