package daemon

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"

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
	return loadMasterKey(dataDir, tokenKeyFile, 32)
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
