package daemon

import (
	"context"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Auth is the API key and envd token service.
func (d *Daemon) Auth() *auth.Service { return d.auth }

// Principal is the caller an API key maps to (auth.Principal; the alias
// keeps the handlers' signatures).
type Principal = auth.Principal

// envdTokenHash is what the store keeps for sandbox id owned by owner.
func (d *Daemon) envdTokenHash(id, owner string) string { return d.auth.EnvdTokenHash(id, owner) }

// Authenticate, EnvdToken and SandboxByToken serve the E2B surface's
// Backend interface (e2b.Backend), which *Daemon satisfies; they are the
// auth service's.
func (d *Daemon) Authenticate(ctx context.Context, key string) (Principal, error) {
	return d.auth.Authenticate(ctx, key)
}

func (d *Daemon) EnvdToken(ctx context.Context, sb *sandbox.Sandbox) (string, error) {
	return d.auth.EnvdToken(ctx, sb)
}

func (d *Daemon) SandboxByToken(ctx context.Context, token string) (*sandbox.Sandbox, error) {
	return d.auth.SandboxByToken(ctx, token)
}
