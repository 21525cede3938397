package egress

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Grant is a secret granted to one sandbox. Inside the sandbox the env var
// Name holds Placeholder; the proxy puts the real Value into the header built
// from HeaderTemplate (e.g. "Authorization: Bearer {{value}}") on requests to
// Host, and replaces Placeholder wherever the sandbox put it in the request
// line or headers. Value never enters the sandbox.
type Grant struct {
	Name           string
	Host           string // exact hostname, e.g. "api.github.com"
	HeaderTemplate string
	Value          string
	Placeholder    string
}

// NewPlaceholder returns a fresh placeholder for a secret named name; the
// daemon puts it in the sandbox's env and passes it back in Grant.
func NewPlaceholder(name string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "berth-secret-" + strings.ToLower(name) + "-" + hex.EncodeToString(b[:])
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
