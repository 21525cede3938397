package daemon

import (
	"testing"

	"github.com/berth-dev/berth/internal/auth"
)

// TestBuildOwnerReserved: the owner template builds run as is reserved
// for berth, so no tenant key can be minted for it.
func TestBuildOwnerReserved(t *testing.T) {
	if !auth.ReservedOwner(BuildOwner) || BuildOwner != auth.BuildOwner {
		t.Fatalf("BuildOwner %q is not auth's reserved build owner %q", BuildOwner, auth.BuildOwner)
	}
}
