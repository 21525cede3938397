package e2e

import (
	"testing"
	"time"
)

// TestTimelineQuickCheck: a checkpoint decides by stat stamps, not
// content, which files changed since the previous one (fsdiff QuickCheck
// over the stamps the previous delta recorded). An untouched 1 MiB file
// is not copied again; a same-size rewrite whose mtime is set back to the
// old one (what an mtime-only check would miss) is caught by its ctime,
// and a rewind to each checkpoint gives each version — on runc and runsc.
func TestTimelineQuickCheck(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			defer s.run("rm", id)
			s.must("exec", id, "--", "sh", "-c",
				"head -c 1048576 /dev/urandom > /home/user/keep && echo aaaa > /home/user/v && touch -r /home/user/v /home/user/ref")
			// Older than the stamp margin (100 ms) when the sandbox is frozen.
			time.Sleep(500 * time.Millisecond)
			c1 := s.checkpoint(s.key, id)
			if c1.Bytes < 1<<20 {
				t.Fatalf("first checkpoint holds %d bytes, want the 1 MiB file", c1.Bytes)
			}
			time.Sleep(500 * time.Millisecond)
			c2 := s.checkpoint(s.key, id) // nothing of ours changed
			if c2.Bytes >= 1<<20 {
				t.Errorf("second checkpoint holds %d bytes: the untouched 1 MiB file was copied again", c2.Bytes)
			}
			// Same size, mtime put back: only ctime tells.
			s.must("exec", id, "--", "sh", "-c", "echo bbbb > /home/user/v && touch -r /home/user/ref /home/user/v")
			time.Sleep(500 * time.Millisecond)
			c3 := s.checkpoint(s.key, id)
			if c3.Bytes >= 1<<20 {
				t.Errorf("third checkpoint holds %d bytes: the untouched 1 MiB file was copied again", c3.Bytes)
			}
			sum := s.must("exec", id, "--", "sha256sum", "/home/user/keep")
			for _, c := range []struct {
				to, want string
			}{{c1.ID, "aaaa"}, {c3.ID, "bbbb"}, {c2.ID, "aaaa"}} {
				if res := s.rewind(id, c.to); res.Mode != "files" {
					t.Fatalf("rewind to %s: %+v", c.to, res)
				}
				if out := s.must("exec", id, "--", "cat", "/home/user/v"); out != c.want {
					t.Errorf("after rewind to %s: v = %q, want %s", c.to, out, c.want)
				}
				if got := s.must("exec", id, "--", "sha256sum", "/home/user/keep"); got != sum {
					t.Errorf("after rewind to %s: keep = %s, want %s", c.to, got, sum)
				}
			}
		})
	}
}
