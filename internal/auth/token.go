package auth

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

// TokenKeyFile is the name of the token key in the data dir (0600), made
// on first start.
const TokenKeyFile = "token.key"

// TokenKeySize is the token key's length in bytes.
const TokenKeySize = 32

// envdToken is the access token of sandbox id while owner owns it.
func (s *Service) envdToken(id, owner string) string {
	m := hmac.New(sha256.New, s.tokenKey)
	m.Write([]byte("berth envd token\x00" + id + "\x00" + owner))
	return hex.EncodeToString(m.Sum(nil)[:24])
}

// EnvdTokenHash is what the store keeps for sandbox id owned by owner.
func (s *Service) EnvdTokenHash(id, owner string) string {
	return TokenHash(s.envdToken(id, owner))
}

// EnvdToken returns sb's access token for its owner (E2B create, connect,
// detail). A sandbox made before tokens were derived holds the hash of a
// random token nobody can recompute: its token is replaced by the derived
// one here, once.
func (s *Service) EnvdToken(ctx context.Context, sb *sandbox.Sandbox) (string, error) {
	tok := s.envdToken(sb.ID, sb.Owner)
	want := TokenHash(tok)
	if sb.AccessTokenHash == want {
		return tok, nil
	}
	_, err := s.store.UpdateSandbox(ctx, sb.ID, func(x *sandbox.Sandbox) error {
		if x.Owner != sb.Owner {
			return errs.E(errs.Conflict, "sandbox %s changed owner", sb.ID)
		}
		x.AccessTokenHash = want
		return nil
	})
	if err != nil {
		return "", err
	}
	sb.AccessTokenHash = want
	return tok, nil
}

// SandboxByToken finds the running-or-paused sandbox with this envd access token.
func (s *Service) SandboxByToken(ctx context.Context, token string) (*sandbox.Sandbox, error) {
	if token == "" {
		return nil, errs.E(errs.NotFound, "no sandbox for an empty token")
	}
	return s.store.SandboxByTokenHash(ctx, TokenHash(token))
}
