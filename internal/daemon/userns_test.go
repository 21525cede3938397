package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/testutil"
)

// setupUserNS opens the data dir to the mapped group for search only, and
// refuses a data dir the mapped root could never reach.
func TestSetupUserNS(t *testing.T) {
	testutil.RequireRoot(t)
	parent := t.TempDir()
	for _, p := range []string{filepath.Dir(parent), parent} { // the test's own temp dirs
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(parent, "data")
	if err := os.MkdirAll(filepath.Join(data, "sandboxes"), 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := setupUserNS(Config{DataDir: data})
	if err != nil || m == nil || *m != runcUserNS {
		t.Fatalf("setupUserNS = %v, %v", m, err)
	}
	for _, p := range []string{data, filepath.Join(data, "sandboxes")} {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 0 || st.Gid != runcUserNS.HostID || st.Mode&0o777 != 0o710 {
			t.Errorf("%s: owner %d:%d mode %o, want 0:%d 0710", p, st.Uid, st.Gid, st.Mode&0o777, runcUserNS.HostID)
		}
	}
	if m, err := setupUserNS(Config{DataDir: data, NoUserNS: true}); m != nil || err != nil {
		t.Errorf("with NoUserNS: %v, %v", m, err)
	}
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := setupUserNS(Config{DataDir: data}); errs.FieldOf(err) != "data_dir" {
		t.Errorf("data dir below a 0700 dir: err %v, want one naming data_dir", err)
	}
}
