package e2e

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testutil"
)

// TestForkParentKeepsNetwork: after a memory fork the parent, restored from
// the fork's image, still reaches what its policy allows (runsc used to
// come back into a namespace whose addresses its first start had taken).
func TestForkParentKeepsNetwork(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" && !strings.Contains(s.must("info"), "runsc") {
				testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
			}
			a := s.create("--runtime", rt, "--allow", "good.test")
			if out, ok := s.fetch(a, "http://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
				t.Fatalf("before the fork: %q", out)
			}
			res := s.fork(a, 1)
			t.Logf("%s fork: mode %s %s", rt, res.Mode, res.Reason)
			for _, id := range []string{a, res.Sandboxes[0].ID} {
				if out, ok := s.fetch(id, "http://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
					t.Errorf("%s after the fork: %q", id, out)
				}
			}
			s.must("rm", "-f", a, res.Sandboxes[0].ID)
		})
	}
}
