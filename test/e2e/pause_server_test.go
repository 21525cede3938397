package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testutil"
)

// TestMemoryPauseKeepsAListeningServer: a sandbox running a TCP server (an
// agent's dev server, the code interpreter's kernel gateway) pauses to
// memory where the runtime can checkpoint — not to disk because of the
// socket — and after resume the same server process answers on the same
// port, from inside and from the host (the port route, as the E2B SDK's
// runCode reaches the kernel gateway): the restore attaches a fresh
// namespace, and the host's neighbour entry for the sandbox's address must
// not send the dial to the old one's MAC (it went unanswered for 15-45 s).
// On runc this needs CRIU to dump a TCP socket on kernels where
// getsockopt(SO_PASSCRED) on one fails (scripts/criu-sockopt-eopnotsupp.patch).
func TestMemoryPauseKeepsAListeningServer(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	// A neighbour on the bridge, as in the E2B suite: with its last port
	// gone at the pause the bridge loses carrier and Linux drops every
	// neighbour entry on it, which hid a stale one.
	other := s.create()
	defer s.run("rm", other)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			defer s.run("rm", id)
			s.must("exec", id, "--", "sh", "-c", "mkdir -p /home/user/www && echo served-before-pause > /home/user/www/index.html")
			s.must("exec", id, "--", "sh", "-c", "httpd -f -p 8080 -h /home/user/www >/dev/null 2>&1 &")
			get := func() string {
				out, _ := s.run("exec", id, "--", "wget", "-qO-", "http://127.0.0.1:8080/")
				return strings.TrimSpace(out)
			}
			port := s.must("port", id, "8080")
			fromHost := func() (string, error) {
				c := http.Client{Timeout: 10 * time.Second}
				req, _ := http.NewRequest("GET", port, nil)
				req.Header.Set("X-API-Key", s.key)
				resp, err := c.Do(req)
				if err != nil {
					return "", err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
				return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b))), err
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
			// The host's neighbour entry for the sandbox is now fresh.
			if got, err := fromHost(); err != nil || got != "200 served-before-pause" {
				t.Fatalf("from the host before the pause: %q %v", got, err)
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
			if got, err := fromHost(); err != nil || got != "200 served-before-pause" {
				t.Fatalf("from the host after the resume: %q %v", got, err)
			}
		})
	}
}
