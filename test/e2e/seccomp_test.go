package e2e

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testutil"
)

// TestSeccompFromInside attacks the syscall filter from inside a real
// sandbox as root: ordinary syscalls work; a socket of the host's vsock
// family (on a VM, the hypervisor's services), a new user namespace and an
// x32-ABI syscall do not. On runc the answers are the filter's: EPERM, and
// for the x32 syscall (an ABI the filter does not list) the calling thread
// is killed. On runsc the Sentry answers them (gVisor has neither vsock nor
// x32); they must fail too.
func TestSeccompFromInside(t *testing.T) {
	s := startServer(t)
	probe := testutil.BuildProgram(t, "./test/e2e/testdata/sysprobe")
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" && !strings.Contains(s.must("info"), "runsc") {
				testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
			}
			id := s.create("--runtime", rt)
			defer s.must("rm", "-f", id)
			s.must("cp", probe, id+":/home/user/sysprobe")
			s.must("exec", id, "--", "chmod", "755", "/home/user/sysprobe")
			if uid := strings.TrimSpace(s.must("exec", "--user", "root", id, "--", "id", "-u")); uid != "0" {
				t.Fatalf("exec runs as uid %s, want root in the sandbox", uid)
			}
			want := map[string]string{"getpid": "ok", "vsock": "EPERM", "unshare-user": "EPERM", "x32-getpid": "killed"}
			for _, p := range []string{"getpid", "vsock", "unshare-user", "x32-getpid"} {
				got := strings.TrimSpace(s.must("exec", "--user", "root", id, "--", "/home/user/sysprobe", p))
				switch {
				case rt == "runc" && got != want[p]:
					t.Errorf("%s: %q, want %q (the filter's answer)", p, got, want[p])
				case rt == "runsc" && (got == "ok") != (p == "getpid"):
					t.Errorf("%s: %q under gVisor", p, got)
				}
			}
		})
	}
}
