// Package auth owns who a caller is: API keys (minted, stored as hashes,
// mapped to a Principal) and the envd access tokens of sandboxes (derived
// with an HMAC key, never stored, looked up by hash). Its state is the token
// key and the store it reads keys from; it holds no lock of its own (the
// store serialises writes).
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Principal is the caller an API key maps to.
type Principal struct {
	Owner string
	Admin bool // may act for any owner (the local admin key)
	// Sandbox, when set, is the sandbox a request came from through the
	// in-sandbox API (docs/STATE.md): the caller is that sandbox itself,
	// acting for its owner on its own state only. Never set with Admin.
	Sandbox string
	// Cluster marks a request an API replica signed with the cluster
	// token (cluster.go): only such a request may choose a sandbox's id.
	Cluster bool
}

// Store is the part of store.Store the service reads and writes: API
// keys, and sandboxes' token hashes. (Cluster mode's API replica runs it
// over the Kubernetes store.)
type Store interface {
	CreateAPIKey(ctx context.Context, k store.APIKey) error
	LookupAPIKey(ctx context.Context, hash []byte) (store.APIKey, error)
	UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)
	SandboxByTokenHash(ctx context.Context, hash string) (*sandbox.Sandbox, error)
}

// Service authenticates API keys and derives envd tokens.
type Service struct {
	store    Store
	dataDir  string
	now      func() time.Time
	tokenKey []byte // HMAC key of envd access tokens
	// clusterToken verifies replicas' signed requests ("" = single host).
	clusterToken string
}

// New builds the service. tokenKey is the content of DATA_DIR/TokenKeyFile
// (loaded by the caller with the daemon's master-key loader); dataDir holds
// admin.key; now is the clock of key creation times.
func New(st Store, dataDir string, now func() time.Time, tokenKey []byte) *Service {
	if now == nil {
		now = time.Now
	}
	return &Service{store: st, dataDir: dataDir, now: now, tokenKey: tokenKey}
}

var ownerRe = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidOwner checks an owner name.
func ValidOwner(field, owner string) error {
	if !ownerRe.MatchString(owner) {
		return errs.Field(field, "must be 1-63 chars of lowercase letters, digits, '.', '_', '-', got %q", owner)
	}
	return nil
}

func hashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// BuildOwner owns the sandboxes template builds run in (the daemon's
// daemon.BuildOwner has the same value; a daemon test keeps them equal).
const BuildOwner = "berth-build"

// reservedOwners are the names berth's own actors own sandboxes or act
// under; a tenant key for one of them would see (or be mistaken for) what
// berth does itself. "admin" owns what the admin key creates for nobody.
var reservedOwners = []string{BuildOwner, "berth", "admin", "reaper", "pool", "build", "e2b", "system", "root"}

// ReservedOwner reports whether owner is kept for berth itself (the names
// above and anything starting "berth-").
func ReservedOwner(owner string) bool {
	return slices.Contains(reservedOwners, owner) || strings.HasPrefix(owner, "berth-")
}

// KeyPrefix starts every API key berth issues. Keys have the shape E2B's
// SDKs check before sending anything (`^e2b_[0-9a-f]+$`), so a berth key
// works wherever an E2B key is expected. Keys issued before this shape
// ("bk_<hex>") are still accepted: lookup is by hash, not by shape.
const KeyPrefix = "e2b_"

// newKey is KeyPrefix and 24 random bytes in lowercase hex.
func newKey() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return KeyPrefix + hex.EncodeToString(b[:])
}

// CreateKey mints an API key for owner; only the hash is stored.
func (s *Service) CreateKey(ctx context.Context, owner string, admin bool) (string, error) {
	if err := ValidOwner("owner", owner); err != nil {
		return "", err
	}
	if !admin && ReservedOwner(owner) {
		return "", errs.Field("owner", "%q is reserved for berth's own actors (%s, and any name starting \"berth-\")",
			owner, strings.Join(reservedOwners, ", "))
	}
	key := newKey()
	var idb [6]byte
	_, _ = rand.Read(idb[:])
	err := s.store.CreateAPIKey(ctx, store.APIKey{
		ID: hex.EncodeToString(idb[:]), Owner: owner, Hash: hashKey(key), Admin: admin, CreatedAt: s.now(),
	})
	if err != nil {
		return "", err
	}
	return key, nil
}

// Authenticate maps an API key to its principal.
func (s *Service) Authenticate(ctx context.Context, key string) (Principal, error) {
	if key == "" {
		return Principal{}, errs.E(errs.Unauthenticated, "missing API key (X-API-Key header or Authorization: Bearer)")
	}
	k, err := s.store.LookupAPIKey(ctx, hashKey(key))
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			return Principal{}, errs.E(errs.Unauthenticated, "invalid API key")
		}
		return Principal{}, err
	}
	return Principal{Owner: k.Owner, Admin: k.Admin}, nil
}

// EnsureAdminKey writes DATA_DIR/admin.key on first start.
func (s *Service) EnsureAdminKey(ctx context.Context) (string, error) {
	p := filepath.Join(s.dataDir, "admin.key")
	if err := PrivateFiles(s.dataDir, "admin.key"); err != nil {
		return "", err
	}
	if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
		key := string(trimSpace(b))
		if _, err := s.Authenticate(ctx, key); err == nil {
			return key, nil
		}
	}
	key, err := s.CreateKey(ctx, "admin", true)
	if err != nil {
		return "", err
	}
	tmp := p + ".tmp"
	_ = os.Remove(tmp) // a leftover keeps its old mode through WriteFile
	if err := os.WriteFile(tmp, []byte(key+"\n"), 0o600); err != nil {
		return "", errs.Wrap(errs.Internal, err, "write admin key")
	}
	return key, errs.Wrap(errs.Internal, os.Rename(tmp, p), "write admin key")
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// PrivateFiles makes the named key files in dir 0600 where they exist (older
// versions, or a leftover temporary file, may have left them readable).
func PrivateFiles(dir string, names ...string) error {
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return errs.Wrap(errs.Internal, err, "chmod %s", p)
		}
	}
	return nil
}

// TokenHash is the hex SHA-256 a token (envd or port token) is stored as.
func TokenHash(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// KeyFromRequest is the API key a REST request carries: X-API-Key, else
// an Authorization bearer token ("" when neither).
func KeyFromRequest(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return k
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
		return strings.TrimPrefix(a, "Bearer ")
	}
	return ""
}
