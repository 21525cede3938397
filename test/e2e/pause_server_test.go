package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testutil"
)

// TestMemoryPauseKeepsAListeningServer: a sandbox running a TCP server (an
// agent's dev server, the code interpreter's kernel gateway) pauses to
// memory where the runtime can checkpoint — not to disk because of the
// socket — and after resume the same server process answers on the same
// port. On runc this needs CRIU to dump a TCP socket on kernels where
// getsockopt(SO_PASSCRED) on one fails (scripts/criu-sockopt-eopnotsupp.patch).
func TestMemoryPauseKeepsAListeningServer(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			defer s.run("rm", id)
			s.must("exec", id, "--", "sh", "-c", "mkdir -p /home/user/www && echo served-before-pause > /home/user/www/index.html")
			s.must("exec", id, "--", "sh", "-c", "httpd -f -p 127.0.0.1:8080 -h /home/user/www >/dev/null 2>&1 &")
			get := func() string {
				out, _ := s.run("exec", id, "--", "wget", "-qO-", "http://127.0.0.1:8080/")
				return strings.TrimSpace(out)
			}
			testutil.Eventually(t, testutil.Within(10*time.Second).Every(100*time.Millisecond), func() error {
				if got := get(); got != "served-before-pause" {
					return fmt.Errorf("the server in %s answers %q", id, got)
				}
				return nil
			})
			pid := strings.TrimSpace(s.must("exec", id, "--", "pidof", "httpd"))
			if pid == "" {
				t.Fatal("httpd is not running")
			}
			s.must("pause", id, "--mode", "memory")
			if wantMemoryPause(t, s, id, rt) != "memory" {
				return // this host cannot checkpoint rt at all: the honest disk fallback was checked
			}
			s.must("resume", id)
			if got := strings.TrimSpace(s.must("exec", id, "--", "pidof", "httpd")); got != pid {
				t.Fatalf("httpd pid %q after resume, was %q: the server was restarted", got, pid)
			}
			if got := get(); got != "served-before-pause" {
				t.Fatalf("the restored server answers %q", got)
			}
		})
	}
}
