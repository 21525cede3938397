// Package sandboxca is berth's own certificate authority for sandbox host
// names (https://<port>-<id>.<domain>, see internal/e2b/hostnames.go). It
// owns the CA key pair in the data dir (created on first use, the key
// 0600 in a 0700 directory that no sandbox mounts) and the leaf
// certificates it issues: ECDSA P-256, short-lived, one per server name
// under the configured domain, cached in memory. It issues for nothing
// outside that domain, whatever a client puts into its TLS ClientHello.
// An operator's certificate (Static) replaces it.
package sandboxca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// File names inside the CA directory.
const (
	KeyFile  = "ca.key"
	CertFile = "ca.crt"
)

// DirName is the CA directory below berth's data dir.
const DirName = "sandbox-ca"

// Dir is the CA directory of a data dir.
func Dir(dataDir string) string { return filepath.Join(dataDir, DirName) }

// Lifetimes. The CA lives long (it is what operators trust); leaves are
// short-lived and renewed from memory well before they expire.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 24 * time.Hour
	leafBackdate = 5 * time.Minute // clock skew between host and client
	// maxCachedLeaves bounds the leaf cache: past it the cache is dropped
	// and refilled (names are per sandbox port, so it stays small).
	maxCachedLeaves = 4096
)

// CA is a loaded certificate authority.
type CA struct {
	key     *ecdsa.PrivateKey
	cert    *x509.Certificate
	certPEM []byte
	now     func() time.Time
}

// LoadOrCreate loads the CA from dir, creating the directory (0700), a
// P-256 key (0600) and a self-signed CA certificate when there is none.
// A key without a certificate (or the reverse) is an error, not silently
// replaced: operators may already trust the old certificate.
func LoadOrCreate(dir string) (*CA, error) {
	return loadOrCreate(dir, time.Now)
}

func loadOrCreate(dir string, now func() time.Time) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "sandbox CA dir")
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "sandbox CA dir")
	}
	keyPath, certPath := filepath.Join(dir, KeyFile), filepath.Join(dir, CertFile)
	keyPEM, kerr := os.ReadFile(keyPath)
	certPEM, cerr := os.ReadFile(certPath)
	switch {
	case kerr == nil && cerr == nil:
		return parse(keyPEM, certPEM, now)
	case errors.Is(kerr, os.ErrNotExist) && errors.Is(cerr, os.ErrNotExist):
		return create(keyPath, certPath, now)
	case kerr != nil && !errors.Is(kerr, os.ErrNotExist):
		return nil, errs.Wrap(errs.Internal, kerr, "read sandbox CA key")
	case cerr != nil && !errors.Is(cerr, os.ErrNotExist):
		return nil, errs.Wrap(errs.Internal, cerr, "read sandbox CA certificate")
	default:
		return nil, errs.E(errs.FailedPrecondition, "sandbox CA in %s has only one of %s and %s; remove both to make a new CA", dir, KeyFile, CertFile)
	}
}

func create(keyPath, certPath string, now func() time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "generate CA key")
	}
	t := now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"berth"}, CommonName: "berth sandbox CA " + t.UTC().Format("2006-01-02")},
		NotBefore:             t.Add(-leafBackdate),
		NotAfter:              t.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "self-sign CA")
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "encode CA key")
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	// The key first, exclusively: two processes starting at once do not
	// both write one (the loser reads the winner's after a retry).
	if err := writeExcl(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeExcl(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	return parse(keyPEM, certPEM, now)
}

func writeExcl(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "write %s", filepath.Base(path))
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return errs.Wrap(errs.Internal, err, "write %s", filepath.Base(path))
	}
	return nil
}

func parse(keyPEM, certPEM []byte, now func() time.Time) (*CA, error) {
	kb, _ := pem.Decode(keyPEM)
	cb, _ := pem.Decode(certPEM)
	if kb == nil || cb == nil {
		return nil, errs.E(errs.FailedPrecondition, "sandbox CA files are not PEM")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, errs.Wrap(errs.FailedPrecondition, err, "sandbox CA key")
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errs.E(errs.FailedPrecondition, "sandbox CA key is not ECDSA")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, errs.Wrap(errs.FailedPrecondition, err, "sandbox CA certificate")
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errs.E(errs.FailedPrecondition, "sandbox CA certificate is not a CA for its key")
	}
	return &CA{key: key, cert: cert, certPEM: pem.EncodeToMemory(cb), now: now}, nil
}

// CertPEM is the CA certificate, PEM-encoded (what clients trust).
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

// Certificate is the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// issue signs a leaf for exactly name.
func (ca *CA) issue(name string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "generate leaf key")
	}
	t := ca.now()
	notAfter := t.Add(leafLifetime)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    t.Add(-leafBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "sign leaf")
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "parse leaf")
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// Issuer hands out leaf certificates for server names under one domain,
// from the CA or from an operator's certificate. Its GetCertificate is a
// tls.Config.GetCertificate.
type Issuer struct {
	domain string
	ca     *CA              // nil with a static certificate
	static *tls.Certificate // the operator's

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewIssuer issues from ca for names under domain.
func NewIssuer(ca *CA, domain string) (*Issuer, error) {
	d, err := NormalizeDomain(domain)
	if err != nil {
		return nil, err
	}
	return &Issuer{domain: d, ca: ca, leaves: map[string]*tls.Certificate{}}, nil
}

// Static serves an operator's certificate (certFile, keyFile: PEM) for
// every name under domain instead of berth's CA.
func Static(domain, certFile, keyFile string) (*Issuer, error) {
	d, err := NormalizeDomain(domain)
	if err != nil {
		return nil, err
	}
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, errs.Field("sandbox_tls_cert", "%v", err)
	}
	return &Issuer{domain: d, static: &c}, nil
}

// Domain is the normalized domain.
func (is *Issuer) Domain() string { return is.domain }

// NormalizeDomain lower-cases domain and checks it is a DNS name of at
// least one label, each 1-63 letters, digits or '-', not starting or
// ending with '-'.
func NormalizeDomain(domain string) (string, error) {
	d := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(domain)), ".")
	if d == "" || len(d) > 200 {
		return "", errs.Field("sandbox_domain", "must be a DNS name (e.g. berth.localhost), got %q", domain)
	}
	for _, l := range strings.Split(d, ".") {
		if !validLabel(l) {
			return "", errs.Field("sandbox_domain", "must be a DNS name of letters, digits, '-' and '.', got %q", domain)
		}
	}
	return d, nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Covers says whether name is one label under the domain (or the domain
// itself): the only names a certificate is issued for.
func (is *Issuer) Covers(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == is.domain {
		return true
	}
	label, ok := strings.CutSuffix(name, "."+is.domain)
	return ok && validLabel(label)
}

// GetCertificate picks the certificate for a ClientHello's server name
// (SNI). A name outside the domain, or no name, gets no certificate: the
// handshake fails and nothing is signed.
func (is *Issuer) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := strings.TrimSuffix(strings.ToLower(hello.ServerName), ".")
	if !is.Covers(name) {
		return nil, fmt.Errorf("sandboxca: no certificate for server name %q (only names under %s)", hello.ServerName, is.domain)
	}
	if is.static != nil {
		return is.static, nil
	}
	return is.leaf(name)
}

func (is *Issuer) leaf(name string) (*tls.Certificate, error) {
	now := is.ca.now()
	is.mu.Lock()
	defer is.mu.Unlock()
	if c, ok := is.leaves[name]; ok && now.Before(renewAt(c.Leaf)) {
		return c, nil
	}
	c, err := is.ca.issue(name)
	if err != nil {
		return nil, err
	}
	if len(is.leaves) >= maxCachedLeaves {
		clear(is.leaves)
	}
	is.leaves[name] = c
	return c, nil
}

// renewAt is when a cached leaf is replaced: at two thirds of its life.
func renewAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// TLSConfig is a server tls.Config for the sandbox listener (HTTP/2 and
// HTTP/1.1, TLS 1.2+).
func (is *Issuer) TLSConfig() *tls.Config {
	return &tls.Config{
		GetCertificate: is.GetCertificate,
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}
