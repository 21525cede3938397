package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
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

// The user-namespace choice: runc gets the mapping unless it is off, runsc
// never; a recorded choice is kept, and a bad record runs without one.
func TestUserNamespacesChoice(t *testing.T) {
	m := runcUserNS
	on := &userNamespaces{m: &m, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	off := &userNamespaces{log: on.log}
	tests := []struct {
		name     string
		u        *userNamespaces
		runtime  string
		recorded string
		want     string // sb.UserNS after preset
		mapped   bool   // of/forRuntime give a mapping
		iso      string
	}{
		{"runc", on, "runc", "", m.String(), true, "namespaces+userns+seccomp"},
		{"runc, userns off", off, "runc", "", userNSNone, false, "namespaces+seccomp"},
		{"runsc", on, "runsc", "", userNSNone, false, "gVisor"},
		{"recorded none kept", on, "runc", userNSNone, userNSNone, false, "namespaces+userns+seccomp"},
		{"recorded mapping kept", off, "runc", m.String(), m.String(), true, "namespaces+seccomp"},
		{"bad record", on, "runc", "garbage", "garbage", false, "namespaces+userns+seccomp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := &sandbox.Sandbox{ID: "sb1", Runtime: tt.runtime, Attrs: sandbox.Attrs{UserNS: tt.recorded}}
			tt.u.preset(sb)
			if sb.UserNS != tt.want {
				t.Errorf("preset: UserNS = %q, want %q", sb.UserNS, tt.want)
			}
			if got := tt.u.of(sb); (got != nil) != tt.mapped || (got != nil && *got != m) {
				t.Errorf("of = %v, want mapped %v", got, tt.mapped)
			}
			if got := tt.u.forRuntime(sb); (got != nil) != tt.mapped || (got != nil && (got.HostID != m.HostID || got.Size != m.Size)) {
				t.Errorf("forRuntime = %v, want mapped %v", got, tt.mapped)
			}
			if got := tt.u.isolation(tt.runtime); got != tt.iso {
				t.Errorf("isolation(%s) = %q, want %q", tt.runtime, got, tt.iso)
			}
		})
	}
}
