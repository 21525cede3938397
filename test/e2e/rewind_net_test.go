package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/testutil"
)

// netIP is the sandbox's address as the server's network attachment has it.
func (s *server) netIP(t *testing.T, id string) string {
	t.Helper()
	var n wire.NetworkInfo
	if err := json.Unmarshal([]byte(s.must("net", "show", id, "--json")), &n); err != nil {
		t.Fatal(err)
	}
	if !n.Attached || n.IP == "" {
		t.Fatalf("sandbox %s is not attached to the network: %+v", id, n)
	}
	return n.IP
}

// reaches asserts that sandbox id reaches good.test by name (the sandbox's
// resolver and the egress policy) over plain HTTP and over TLS through the
// egress proxy, and that the egress log attributes both requests to id.
func (s *server) reaches(t *testing.T, id, when string) {
	t.Helper()
	n := len(s.netLog(id))
	if out, ok := s.fetch(id, "http://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
		t.Fatalf("%s: http://good.test/ from %s: %q", when, id, out)
	}
	if out, ok := s.fetchAs(id, "https://good.test/"); !ok || !strings.Contains(out, "host=good.test") {
		t.Fatalf("%s: https://good.test/ from %s: %q", when, id, out)
	}
	testutil.Eventually(t, testutil.Within(15*time.Second).Every(250*time.Millisecond), func() error {
		log := s.netLog(id)
		allowed := 0
		for _, e := range log[min(n, len(log)):] {
			if e.Host == "good.test" && e.Verdict == "allow" {
				allowed++
			}
		}
		if allowed < 2 {
			return fmt.Errorf("%s: the egress log of %s has %d new allowed good.test entries, want 2: %+v", when, id, allowed, log[min(n, len(log)):])
		}
		return nil
	})
}

// TestRewindKeepsNetwork (issue 18 bug): a sandbox rewound in place — to a
// files-only checkpoint and to a memory one — and a parent that took a
// child's state by promote still reach what their policy allows, by name,
// keep their address (on runsc a fresh attachment takes the lowest free
// one, which is theirs here: nothing else attaches meanwhile), and their
// requests are still theirs in the egress log. On runsc the sandbox used to come back into a network namespace
// whose addresses its previous start had taken into its own netstack
// ("network is unreachable").
func TestRewindKeepsNetwork(t *testing.T) {
	requireRunsc(t)
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt, "--allow", "good.test")
			defer s.run("rm", "-f", id)
			s.installFetch(id, inet)
			ip := s.netIP(t, id)
			s.reaches(t, id, "before")
			files := s.checkpoint(s.key, id, "--name", "files")
			mem := s.checkpoint(s.key, id, "--memory", "--name", "mem")
			t.Logf("%s: checkpoint --memory: mode %s %s", rt, mem.Mode, mem.Reason)
			s.must("exec", id, "--", "sh", "-c", "echo later > /home/user/later")

			for _, to := range []wire.Checkpoint{files, mem, files} {
				res := s.rewind(id, to.ID)
				t.Logf("%s: rewind to %s: mode %s in %d ms %s", rt, to.Name, res.Mode, res.Millis, res.Reason)
				// A memory restore may fall back to a boot, saying why (a
				// restore that timed out on a loaded host); the network must
				// work either way.
				if res.Mode != to.Mode && (res.Mode != "files" || res.Reason == "") {
					t.Fatalf("rewind to %s (%s checkpoint): mode %s %s", to.Name, to.Mode, res.Mode, res.Reason)
				}
				s.reaches(t, id, "after the rewind to "+to.Name)
				if got := s.netIP(t, id); got != ip {
					t.Errorf("after the rewind to %s the sandbox's address is %s, was %s", to.Name, got, ip)
				}
			}

			// Promote goes through the same restart.
			res := s.fork(id, 1)
			child := res.Sandboxes[0].ID
			defer s.run("rm", "-f", child)
			s.must("exec", child, "--", "sh", "-c", "echo child > /home/user/who")
			var pr wire.PromoteChildResult
			if err := json.Unmarshal([]byte(s.must("promote", child, "--json")), &pr); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: promote: mode %s in %d ms %s", rt, pr.Mode, pr.Millis, pr.Reason)
			if out := s.must("exec", id, "--", "cat", "/home/user/who"); out != "child" {
				t.Fatalf("parent after the promote: %q", out)
			}
			s.reaches(t, id, "after the promote")
			s.reaches(t, child, "the promoted child")
			if got := s.netIP(t, id); got != ip {
				t.Errorf("after the promote the parent's address is %s, was %s", got, ip)
			}
		})
	}
}

// TestRewindKilledKeepsNetwork: the daemon is killed (SIGKILL) in the middle
// of a rewind, once the sandbox is halted and the restart journal written
// (its network attachment is kept for the boot, and on runsc refreshed: the
// addresses its Sentry took are back in the namespace). After a
// restart the interrupted rewind is settled and the sandbox, started again
// where the restart found it dead, reaches what its policy allows, by name,
// with its requests attributed to it.
func TestRewindKilledKeepsNetwork(t *testing.T) {
	requireRunsc(t)
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt, "--allow", "good.test")
			defer s.run("rm", "-f", id)
			s.installFetch(id, inet)
			s.reaches(t, id, "before")
			ck := s.checkpoint(s.key, id)
			cmd := exec.Command(filepath.Join(s.bin, "berth"), "rewind", id, "--to", ck.ID)
			cmd.Env = s.env(s.key)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			mark := filepath.Join(s.dataDir, "sandboxes", id, "timeline-restart.json")
			testutil.Eventually(t, testutil.Within(30*time.Second).Every(time.Millisecond), func() error {
				if _, err := os.Stat(mark); err != nil {
					return fmt.Errorf("the restart journal never appeared: %v", err)
				}
				return nil
			})
			s.kill9()
			_ = cmd.Wait()
			s.start()
			if !strings.Contains(s.must("events", id, "--json"), "restart_settled") {
				t.Errorf("no restart_settled event")
			}
			if v := inspect(t, s, id); v.State != "running" {
				t.Logf("%s: after the restart the sandbox is %s; starting it", rt, v.State)
				s.must("start", id)
			}
			s.reaches(t, id, "after the interrupted rewind")
		})
	}
}
