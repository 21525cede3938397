package e2e

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSandboxCAOutOfReach attacks berth's sandbox CA from inside a real
// sandbox as root, on runc and runsc: the CA key (DATA_DIR/sandbox-ca,
// 0600 in the root-only data dir) cannot be read by its host path, through
// /proc, or found anywhere in the sandbox's view; the sandbox TLS listener
// (on host loopback) cannot be reached from the sandbox; and berth issues
// no certificate for a name outside --sandbox-domain to anyone who does
// reach it (a handshake for such a name fails, one inside the domain gets
// a leaf for exactly that name). Afterwards the key is unchanged.
func TestSandboxCAOutOfReach(t *testing.T) {
	requireRunsc(t)
	tlsAddr := freePort(t)
	const domain = "berth.test"
	s := startServer(t, "--sandbox-domain", domain, "--sandbox-tls-listen", tlsAddr)
	caDir := filepath.Join(s.dataDir, "sandbox-ca")
	keyPath := filepath.Join(caDir, "ca.key")
	key, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatalf("serve --sandbox-domain made no CA key: %v", err)
	}
	if st, _ := os.Stat(keyPath); st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key mode %o, want 600", st.Mode().Perm())
	}
	kb, _ := pem.Decode(key)
	if kb == nil {
		t.Fatal("CA key is not PEM")
	}
	// A line of the key's base64 body: what a sandbox would print if it
	// reached the key in any form.
	keyLine := strings.Split(string(key), "\n")[1]
	before := sha256.Sum256(key)

	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	// The probe the sandbox runs, from the host: it does detect the listener.
	if pc, err := net.DialTimeout("tcp", tlsAddr, 5*time.Second); err != nil {
		t.Fatal(err)
	} else {
		_, _ = pc.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(pc)
		pc.Close()
		if !strings.Contains(string(b), "to an HTTPS server") {
			t.Fatalf("the listener answered the plain-HTTP probe with %q", b)
		}
	}
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			defer s.run("rm", id)
			script := strings.Join([]string{
				"cat " + keyPath,
				"cat " + caDir + "/*",
				"for p in /proc/[0-9]*/root" + caDir + "/ca.key; do cat $p; done",
				"cat /proc/1/root" + keyPath,
				"find / -xdev -name ca.key 2>/dev/null | while read f; do cat \"$f\"; done",
				"find / -path /proc -prune -o -path /sys -prune -o -type d -name sandbox-ca -print 2>/dev/null | while read d; do cat \"$d\"/*; done",
				// The TLS listener on host loopback, from the sandbox's own
				// loopback and from its gateway (where the egress proxy may
				// take any connection: only the listener's own answer to
				// plain HTTP, Go's "HTTP request to an HTTPS server", counts).
				"for h in 127.0.0.1 $(ip route | awk '/^default/ {print $3}'); do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 $h " + tlsPort + " 2>&1 | sed 's/^/answer: /'; done",
				"true",
			}, "; ")
			out, _ := s.run("exec", "--user", "root", id, "--", "sh", "-c", script)
			t.Logf("the sandbox's attempts:\n%s", out)
			if strings.Contains(out, keyLine) || strings.Contains(out, "PRIVATE KEY") {
				t.Fatalf("the sandbox read the CA key:\n%s", out)
			}
			if strings.Contains(out, "to an HTTPS server") {
				t.Fatalf("the sandbox reached the sandbox TLS listener:\n%s", out)
			}
		})
	}

	// Whoever reaches the listener gets certificates only for names under
	// the domain, issued by berth's CA.
	caPEM, err := os.ReadFile(filepath.Join(caDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if out, code := s.run("ca", "--data-dir", s.dataDir); code != 0 || out != string(caPEM) {
		t.Fatalf("berth ca printed %q (exit %d), want the CA certificate", out, code)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt is not a PEM certificate")
	}
	dial := func(name string) (*tls.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tlsAddr, &tls.Config{ServerName: name, RootCAs: pool})
	}
	for _, name := range []string{"evil.example.com", "berth.test.evil.com", "a.b." + domain, "localhost"} {
		if c, err := dial(name); err == nil {
			c.Close()
			t.Errorf("handshake for %q succeeded: berth issued a certificate outside %s", name, domain)
		}
		// Nor does a client that does not check get one.
		if c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tlsAddr, &tls.Config{ServerName: name, InsecureSkipVerify: true}); err == nil {
			t.Errorf("handshake for %q (unverified) got certificate %v", name, c.ConnectionState().PeerCertificates[0].DNSNames)
			c.Close()
		}
	}
	name := "8000-abc." + domain
	c, err := dial(name)
	if err != nil {
		t.Fatalf("handshake for %s: %v", name, err)
	}
	leaf := c.ConnectionState().PeerCertificates[0]
	c.Close()
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != name || leaf.NotAfter.Sub(leaf.NotBefore) > 25*time.Hour {
		t.Fatalf("leaf for %s: names %v, valid %s - %s", name, leaf.DNSNames, leaf.NotBefore, leaf.NotAfter)
	}
	after, _ := os.ReadFile(keyPath)
	if sum := sha256.Sum256(after); !bytes.Equal(sum[:], before[:]) {
		t.Fatal("the CA key changed")
	}
}
