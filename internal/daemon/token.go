package daemon

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Envd access tokens (E2B's X-Access-Token) are never stored: the store
// holds their SHA-256, like API keys, so a copy of berth.db drives no
// sandbox. E2B hands the token out again on connect and detail, so the
// daemon derives it, HMAC(token.key, id, owner), instead of keeping it; a
// pool claim changes the owner and with it the token.

const tokenKeyFile = "token.key"

// loadTokenKey reads DATA_DIR/token.key (0600), creating it on first start.
func loadTokenKey(dataDir string) ([]byte, error) {
	p := filepath.Join(dataDir, tokenKeyFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		b = make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "generate %s", tokenKeyFile)
		}
		tmp := p + ".tmp"
		_ = os.Remove(tmp)
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "write %s", tokenKeyFile)
		}
		if err := os.Rename(tmp, p); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "write %s", tokenKeyFile)
		}
		return b, nil
	}
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "read %s", tokenKeyFile)
	}
	if len(b) != 32 {
		return nil, errs.E(errs.FailedPrecondition, "%s has %d bytes, want 32", p, len(b))
	}
	return b, privateFiles(dataDir, tokenKeyFile)
}

// envdToken is the access token of sandbox id while owner owns it.
func (d *Daemon) envdToken(id, owner string) string {
	m := hmac.New(sha256.New, d.tokenKey)
	m.Write([]byte("berth envd token\x00" + id + "\x00" + owner))
	return hex.EncodeToString(m.Sum(nil)[:24])
}

// envdTokenHash is what the store keeps for sandbox id owned by owner.
func (d *Daemon) envdTokenHash(id, owner string) string {
	return tokenHash(d.envdToken(id, owner))
}

// EnvdToken returns sb's access token for its owner (E2B create, connect,
// detail). A sandbox made before tokens were derived holds the hash of a
// random token nobody can recompute: its token is replaced by the derived
// one here, once.
func (d *Daemon) EnvdToken(ctx context.Context, sb *sandbox.Sandbox) (string, error) {
	tok := d.envdToken(sb.ID, sb.Owner)
	want := tokenHash(tok)
	if sb.AccessTokenHash == want {
		return tok, nil
	}
	_, err := d.store.UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
		if s.Owner != sb.Owner {
			return errs.E(errs.Conflict, "sandbox %s changed owner", sb.ID)
		}
		s.AccessTokenHash = want
		return nil
	})
	if err != nil {
		return "", err
	}
	sb.AccessTokenHash = want
	return tok, nil
}
