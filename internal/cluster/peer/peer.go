// Package peer is the authenticated channel between cluster mode's API
// replicas and its node agents (docs/CLUSTER.md).
//
// Both directions are authenticated. A node serves its peer endpoint over
// TLS with a self-signed certificate whose SHA-256 it publishes in its Node
// object; a replica dials it pinning that hash (the Kubernetes API, which
// both trust, is where the hash comes from). The replica proves itself with
// the cluster token, a random secret in the Secret `berth-cluster` that only
// the berth service accounts can read; with it, it states the principal it
// acts for (the owner it authenticated). A node never takes a principal
// from a request without the token, and a replica strips every header of
// this package from a client's request before it forwards it.
package peer

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Headers of the channel.
const (
	HeaderToken     = "X-Berth-Cluster-Token"
	HeaderPrincipal = "X-Berth-Principal"
	// HeaderSandboxID is the id a replica chose for a sandbox it asks a
	// node to create (the Sandbox object's name), honoured only with the token.
	HeaderSandboxID = "X-Berth-Sandbox-Id"
)

// Principal is who a replica acts for.
type Principal struct {
	Owner string `json:"owner"`
	Admin bool   `json:"admin,omitempty"`
}

// Sign marks req as the replica's, acting for p.
func Sign(req *http.Request, token string, p Principal) {
	b, _ := json.Marshal(p)
	req.Header.Set(HeaderToken, token)
	req.Header.Set(HeaderPrincipal, string(b))
}

// Strip removes the channel's headers: a client's request never carries
// them past a replica.
func Strip(h http.Header) {
	h.Del(HeaderToken)
	h.Del(HeaderPrincipal)
	h.Del(HeaderSandboxID)
}

// Verify reads the principal of a replica's request. ok is false when the
// request carries no token (an ordinary client: authenticate it the usual
// way); a token that does not match, or a token without a principal, is
// an Unauthenticated error.
func Verify(req *http.Request, token string) (p Principal, ok bool, err error) {
	got := req.Header.Get(HeaderToken)
	if got == "" {
		if req.Header.Get(HeaderPrincipal) != "" || req.Header.Get(HeaderSandboxID) != "" {
			return Principal{}, false, errs.E(errs.Unauthenticated, "cluster headers without the cluster token")
		}
		return Principal{}, false, nil
	}
	if token == "" || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
		return Principal{}, false, errs.E(errs.Unauthenticated, "bad cluster token")
	}
	raw := req.Header.Get(HeaderPrincipal)
	if len(raw) > 4096 {
		return Principal{}, false, errs.E(errs.Unauthenticated, "cluster principal too long")
	}
	if err := json.Unmarshal([]byte(raw), &p); err != nil || (p.Owner == "" && !p.Admin) {
		return Principal{}, false, errs.E(errs.Unauthenticated, "cluster request without a principal")
	}
	return p, true, nil
}

// Identity is a node's TLS identity.
type Identity struct {
	Cert   tls.Certificate
	SHA256 string // hex SHA-256 of the leaf certificate's DER
}

// LoadOrCreateIdentity reads dir/peer.crt and dir/peer.key, or makes them
// (ECDSA P-256, self-signed, ten years, the given hosts as SANs).
func LoadOrCreateIdentity(dir string, hosts []string) (Identity, error) {
	crt, key := filepath.Join(dir, "peer.crt"), filepath.Join(dir, "peer.key")
	if c, err := tls.LoadX509KeyPair(crt, key); err == nil {
		return identity(c), nil
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Identity{}, errs.Wrap(errs.Internal, err, "peer key")
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "berth-node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return Identity{}, errs.Wrap(errs.Internal, err, "peer certificate")
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return Identity{}, errs.Wrap(errs.Internal, err, "peer key")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Identity{}, errs.Wrap(errs.Internal, err, "peer dir")
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return Identity{}, errs.Wrap(errs.Internal, err, "peer key")
	}
	if err := os.WriteFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return Identity{}, errs.Wrap(errs.Internal, err, "peer certificate")
	}
	c, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		return Identity{}, errs.Wrap(errs.Internal, err, "peer certificate")
	}
	return identity(c), nil
}

func identity(c tls.Certificate) Identity {
	sum := sha256.Sum256(c.Certificate[0])
	return Identity{Cert: c, SHA256: hex.EncodeToString(sum[:])}
}

// ServerTLS is the node's listener configuration.
func (id Identity) ServerTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{id.Cert}}
}

// PinnedTLS accepts exactly the certificate whose SHA-256 is certSHA256.
func PinnedTLS(certSHA256 string) *tls.Config {
	want, _ := hex.DecodeString(certSHA256)
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, //nolint:gosec // replaced by the pin below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errs.E(errs.Unauthenticated, "peer sent no certificate")
			}
			sum := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if len(want) != sha256.Size || subtle.ConstantTimeCompare(sum[:], want) != 1 {
				return errs.E(errs.Unauthenticated, "peer certificate does not match the Node's certSHA256")
			}
			return nil
		},
	}
}

// Transport dials one node, pinning its certificate. Streams (exec, PTY,
// watches) go through it as well, so it sets no response timeout.
func Transport(certSHA256 string) *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     PinnedTLS(certSHA256),
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false, // HTTP/1.1: the WebSocket upgrades of E2B and PTY streams need it
	}
}

// NewToken makes a cluster token.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
