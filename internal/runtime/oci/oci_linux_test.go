package oci

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/runtimetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Host paths of the runtimes; the setup script installs them there.
const (
	runscPath = "/var/cache/berth/bin/runsc"
	criuPath  = "/var/cache/berth/bin/criu"
)

func newBackend(t *testing.T, name string) *OCI {
	t.Helper()
	cfg := Config{Root: filepath.Join(t.TempDir(), "state")}
	switch name {
	case Runc:
		runtimetest.RequireHost(t, "runc")
		criu := criuPath
		if p := os.Getenv("BERTH_CRIU"); p != "" {
			criu = p // as for berth serve: e.g. a stand-in, to see the suite on a host where CRIU hangs
		}
		if _, err := os.Stat(criu); err == nil {
			cfg.CRIU = criu
		} else if os.Getenv("CI") == "true" {
			t.Fatalf("criu not built at %s (scripts/build-criu.sh)", criu)
		}
	case Runsc:
		runtimetest.RequireHost(t, runscPath)
		cfg.Binary = runscPath
	}
	// runsc bind-mounts a shared empty netns into its root and never
	// unmounts it; TempDir's RemoveAll would fail with EBUSY.
	t.Cleanup(func() {
		for unix.Unmount(filepath.Join(cfg.Root, "null-netns"), unix.MNT_DETACH) == nil {
		}
	})
	o, err := New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestRuncConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime { return newBackend(t, Runc) })
}

func TestRunscConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime { return newBackend(t, Runsc) })
}
