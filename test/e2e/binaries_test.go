package e2e

import (
	"os"
	"testing"

	"github.com/berth-dev/berth/internal/testutil"
)

// TestMain removes the binaries the tests built once for the whole package.
func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBinaries()
	os.Exit(code)
}
