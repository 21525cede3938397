package egress

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Grant is a secret granted to one sandbox: one lease of it
// (internal/leases). Inside the sandbox the env var Name holds Placeholder;
// while the grant is active the proxy puts the real Value into the header
// built from HeaderTemplate (e.g. "Authorization: Bearer {{value}}") on
// requests to Host (DecideGrants says when). Value never enters the sandbox.
type Grant struct {
	Name           string
	Host           string // exact hostname, e.g. "api.github.com"
	HeaderTemplate string
	Value          string
	Placeholder    string
	// Lease is the lease's id (for the egress log); State is GrantActive
	// (""), GrantFrozen or GrantRevoked; Expires (zero: never) ends an
	// active grant like a revocation.
	Lease   string
	State   string
	Expires time.Time

	// refuse logs a refused use (set by the proxy's lookup, grantsFor).
	refuse func(verdict, reason string)
}

// Grant states: only an active grant is injected.
const (
	GrantActive  = ""
	GrantFrozen  = "frozen"
	GrantRevoked = "revoked"
)

// Verdicts of a refused grant in the egress log: the request went on with
// the sandbox's placeholder in it, never the real value.
const (
	VerdictLeaseRevoked = "lease_revoked"
	VerdictLeaseFrozen  = "lease_frozen"
)

// GrantRefusal is a grant DecideGrants did not inject, and why.
type GrantRefusal struct {
	Grant   Grant
	Verdict string // VerdictLeaseRevoked or VerdictLeaseFrozen
	Reason  string
}

// DecideGrants is the proxy's decision on one request to a host (grants are
// the sandbox's grants for that host): which to inject, which to refuse.
// Per secret name:
//   - the request carries a placeholder of that secret (in its target or
//     any header) that is not the sandbox's active lease of it — an old
//     generation's, a frozen one, or another sandbox's (a fork's parent):
//     refused, nothing is injected for that secret;
//   - else an active, unexpired grant is injected;
//   - else (only frozen or revoked leases): refused.
//
// The placeholder names a lease, it is not the credential: the proxy knows
// the sandbox by its address, and injects only what that sandbox holds now.
func DecideGrants(now time.Time, grants []Grant, target string, h http.Header) (inject []Grant, refused []GrantRefusal) {
	var names []string
	by := map[string][]Grant{}
	for _, g := range grants {
		if _, ok := by[g.Name]; !ok {
			names = append(names, g.Name)
		}
		by[g.Name] = append(by[g.Name], g)
	}
	for _, name := range names {
		gs := by[name]
		var active *Grant
		for i := range gs {
			if gs[i].State == GrantActive && (gs[i].Expires.IsZero() || now.Before(gs[i].Expires)) {
				active = &gs[i]
				break
			}
		}
		stale := ""
		for _, ph := range placeholdersIn(name, target, h) {
			if active == nil || ph != strings.ToLower(active.Placeholder) {
				stale = ph
				break
			}
		}
		switch {
		case stale != "":
			refused = append(refused, refusalOf(now, gs, stale))
		case active != nil:
			inject = append(inject, *active)
		default:
			refused = append(refused, refusalOf(now, gs, strings.ToLower(gs[len(gs)-1].Placeholder)))
		}
	}
	return inject, refused
}

// refusalOf explains why placeholder ph (lower case) of gs's secret is not
// injected.
func refusalOf(now time.Time, gs []Grant, ph string) GrantRefusal {
	for _, g := range gs {
		if strings.ToLower(g.Placeholder) != ph {
			continue
		}
		switch {
		case g.State == GrantFrozen:
			return GrantRefusal{Grant: g, Verdict: VerdictLeaseFrozen, Reason: "lease " + g.Lease + " is frozen (sandbox paused)"}
		case g.State == GrantRevoked:
			return GrantRefusal{Grant: g, Verdict: VerdictLeaseRevoked, Reason: "lease " + g.Lease + " is revoked"}
		case !g.Expires.IsZero() && !now.Before(g.Expires):
			return GrantRefusal{Grant: g, Verdict: VerdictLeaseRevoked, Reason: "lease " + g.Lease + " expired"}
		}
	}
	return GrantRefusal{Grant: gs[0], Verdict: VerdictLeaseRevoked, Reason: "placeholder is not a current lease of this sandbox"}
}

// placeholdersIn returns the placeholders of secret name (as NewPlaceholder
// makes them, compared in lower case) in a request's target and headers.
func placeholdersIn(name, target string, h http.Header) []string {
	prefix := placeholderPrefix + strings.ToLower(name) + "-"
	var out []string
	scan := func(v string) {
		v = strings.ToLower(v)
		for {
			i := strings.Index(v, prefix)
			if i < 0 {
				return
			}
			v = v[i+len(prefix):]
			n := 0
			for n < len(v) && n < placeholderHex && isHex(v[n]) {
				n++
			}
			if n == placeholderHex {
				out = append(out, prefix+v[:n])
			}
		}
	}
	scan(target)
	for _, vs := range h {
		for _, v := range vs {
			scan(v)
		}
	}
	return out
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

const (
	placeholderPrefix = "berth-secret-"
	placeholderHex    = 32
)

// NewPlaceholder returns a fresh placeholder for a secret named name; the
// daemon puts it in the sandbox's env and passes it back in Grant.
func NewPlaceholder(name string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return placeholderPrefix + strings.ToLower(name) + "-" + hex.EncodeToString(b[:])
}

// Validate checks a grant; errors name the field.
func (g Grant) Validate() error {
	if g.Name == "" {
		return errs.Field("secret.name", "must not be empty")
	}
	if err := validHostname(normalizeHost(g.Host)); err != nil || normalizeHost(g.Host) == "" {
		return errs.Field("secret.host", "%q is not a hostname", g.Host)
	}
	name, value, ok := strings.Cut(g.HeaderTemplate, ":")
	if !ok || strings.TrimSpace(name) == "" || strings.ContainsAny(name, " \t\r\n") ||
		!strings.Contains(value, "{{value}}") || strings.ContainsAny(value, "\r\n") {
		return errs.Field("secret.header", "%q must look like \"Header-Name: ... {{value}} ...\"", g.HeaderTemplate)
	}
	if strings.ContainsAny(g.Value, "\r\n") {
		return errs.Field("secret.value", "must not contain line breaks")
	}
	if len(g.Placeholder) < 16 {
		return errs.Field("secret.placeholder", "must be at least 16 characters (use NewPlaceholder)")
	}
	if g.State != GrantActive && g.State != GrantFrozen && g.State != GrantRevoked {
		return errs.Field("secret.state", "must be \"\", frozen or revoked, got %q", g.State)
	}
	return nil
}

// header returns the header name and value the template produces.
func (g Grant) header() (string, string) {
	name, value, _ := strings.Cut(g.HeaderTemplate, ":")
	return strings.TrimSpace(name), strings.TrimSpace(strings.ReplaceAll(value, "{{value}}", g.Value))
}

// Sealer encrypts secret values at rest with AES-256-GCM under a key kept in
// a file of its own (0600).
type Sealer struct{ aead cipher.AEAD }

// LoadOrCreateSealer reads dir/secrets.key, creating it on first use.
func LoadOrCreateSealer(dir string) (*Sealer, error) {
	path := filepath.Join(dir, "secrets.key")
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "generate secrets key")
		}
		if err := writeFileAtomic(path, key, 0o600); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "read secrets key")
	}
	if len(key) != 32 {
		return nil, errs.E(errs.FailedPrecondition, "%s: want a 32-byte key, got %d bytes", path, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "secrets cipher")
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "secrets cipher")
	}
	return &Sealer{aead: aead}, nil
}

// Seal encrypts plaintext; aad (e.g. the owner and secret name) binds the
// ciphertext to its row so it cannot be swapped with another.
func (s *Sealer) Seal(plaintext, aad []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "nonce")
	}
	return s.aead.Seal(nonce, nonce, plaintext, aad), nil
}

// Open decrypts what Seal produced with the same aad.
func (s *Sealer) Open(ciphertext, aad []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(ciphertext) < n {
		return nil, errs.E(errs.InvalidArgument, "sealed secret too short")
	}
	pt, err := s.aead.Open(nil, ciphertext[:n], ciphertext[n:], aad)
	if err != nil {
		return nil, errs.Wrap(errs.PermissionDenied, err, "open sealed secret")
	}
	return pt, nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "create %s", filepath.Dir(path))
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "write %s", path)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return errs.Wrap(errs.Internal, err, "write %s", path)
	}
	return nil
}
