package daemon

import (
	"github.com/berth-dev/berth/internal/auth"
)

// Auth is the API key and envd token service; the handlers and the E2B
// surface call it directly (Authenticate, EnvdToken, SandboxByToken).
func (d *Daemon) Auth() *auth.Service { return d.auth }

// Principal is the caller an API key maps to (auth.Principal; the alias
// keeps the handlers' signatures).
type Principal = auth.Principal
