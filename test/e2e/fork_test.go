package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/testutil"
)

// stopRunsc removes every sandbox and stops the server, then unmounts the
// empty network namespace runsc keeps bind-mounted under its state root for
// the daemon's lifetime (the harness would report it as left behind).
func (s *server) stopRunsc() {
	out, _ := s.run("ls", "--json")
	var list []struct{ ID string }
	_ = json.Unmarshal([]byte(out), &list)
	for _, sb := range list {
		s.run("rm", "-f", sb.ID)
	}
	s.stop()
	p := filepath.Join(s.dataDir, "runtime", "runsc", "null-netns")
	for unix.Unmount(p, unix.MNT_DETACH) == nil {
	}
	_ = os.Remove(p)
}

type forkResult struct {
	Parent    string `json:"parent"`
	Snapshot  string `json:"snapshot"`
	Mode      string `json:"fork_mode"`
	Reason    string `json:"reason"`
	Sandboxes []struct {
		ID    string            `json:"id"`
		Extra map[string]string `json:"extra"`
	} `json:"sandboxes"`
	Ms int64 `json:"ms"`
}

func (s *server) fork(id string, n int) forkResult {
	s.t.Helper()
	var res forkResult
	out := s.must("fork", id, "-n", strconv.Itoa(n), "--json")
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		s.t.Fatalf("fork output: %v\n%s", err, out)
	}
	if len(res.Sandboxes) != n {
		s.t.Fatalf("fork made %d of %d: %s", len(res.Sandboxes), n, res.Reason)
	}
	return res
}

// TestForkTenDivergent: ten forks of one sandbox, each writing its own
// file, see the parent's files and none of each other's writes.
func TestForkTenDivergent(t *testing.T) {
	s := startServer(t)
	parent := s.create()
	s.must("exec", "--user", "root", parent, "--", "sh", "-c", "echo shared > /root/shared")
	res := s.fork(parent, 10)
	t.Logf("fork of 10 (runc): fork_mode %s in %d ms %s", res.Mode, res.Ms, res.Reason)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	ids := map[string]bool{}
	for _, c := range res.Sandboxes {
		ids[c.ID] = true
		if c.Extra["fork_parent"] != parent || c.Extra["fork_generation"] != "1" || c.Extra["fork_mode"] != res.Mode {
			t.Errorf("child %s lineage %v", c.ID, c.Extra)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, code := s.run("exec", "--user", "root", c.ID, "--", "sh", "-c",
				"cat /root/shared; echo "+c.ID+" > /root/mine; ls /root; hostname; echo $BERTH_SANDBOX_ID; cat /etc/machine-id")
			if code != 0 {
				errs <- fmt.Errorf("%s: exit %d %s", c.ID, code, out)
				return
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if lines[0] != "shared" || !strings.Contains(out, "mine") {
				errs <- fmt.Errorf("%s sees %q", c.ID, out)
			}
			if lines[len(lines)-2] != c.ID {
				errs <- fmt.Errorf("%s: BERTH_SANDBOX_ID %q", c.ID, lines[len(lines)-2])
			}
			if len(lines[len(lines)-1]) != 32 {
				errs <- fmt.Errorf("%s: machine-id %q", c.ID, lines[len(lines)-1])
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(ids) != 10 {
		t.Fatalf("ids not unique: %v", ids)
	}
	machineIDs := map[string]bool{}
	for id := range ids {
		if out := s.must("exec", "--user", "root", id, "--", "cat", "/root/mine"); out != id {
			t.Errorf("%s reads %q from its own file: writes leaked between forks", id, out)
		}
		machineIDs[s.must("exec", id, "--", "cat", "/etc/machine-id")] = true
	}
	if len(machineIDs) != 10 {
		t.Errorf("machine-ids not unique across forks: %v", machineIDs)
	}
	if _, code := s.run("exec", "--user", "root", parent, "--", "test", "-e", "/root/mine"); code == 0 {
		t.Error("a fork's write leaked into the parent")
	}
	var insp struct {
		Extra map[string]string `json:"extra"`
	}
	first := res.Sandboxes[0].ID
	_ = json.Unmarshal([]byte(s.must("inspect", first)), &insp)
	if insp.Extra["fork_parent"] != parent || insp.Extra["snapshot"] != res.Snapshot {
		t.Errorf("inspect lineage %v", insp.Extra)
	}

	t.Run("second generation", func(t *testing.T) {
		g2 := s.fork(first, 1)
		if g := g2.Sandboxes[0].Extra["fork_generation"]; g != "2" {
			t.Fatalf("generation %q, want 2", g)
		}
		if out := s.must("exec", "--user", "root", g2.Sandboxes[0].ID, "--", "cat", "/root/mine"); out != first {
			t.Fatalf("grandchild sees %q, want its parent's file %s", out, first)
		}
	})

	t.Run("bad count and paused parent", func(t *testing.T) {
		for _, n := range []int{0, 101} {
			code, body := s.api(s.key, "POST", "/v1/sandboxes/"+parent+"/fork", map[string]any{"count": n})
			if code != 400 || body["field"] != "count" {
				t.Errorf("count %d: %d %v", n, code, body)
			}
		}
		s.must("pause", parent, "--mode", "freeze")
		code, body := s.api(s.key, "POST", "/v1/sandboxes/"+parent+"/fork", map[string]any{"count": 1})
		if code != 409 || !strings.Contains(fmt.Sprint(body["message"]), "paused") {
			t.Errorf("fork of a paused sandbox: %d %v", code, body)
		}
		s.must("resume", parent)
	})
}

// TestForkMemoryRunsc: a counter running in the parent keeps counting in
// every child, each from the value it had at the fork.
func TestForkMemoryRunsc(t *testing.T) {
	testutil.RequireRoot(t)
	s := startServer(t)
	if !strings.Contains(s.must("info"), "runsc") {
		testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
	}
	defer s.stopRunsc()
	parent := s.create("--runtime", "runsc")
	s.must("exec", "--user", "root", parent, "--", "sh", "-c",
		"(i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.05; done) >/dev/null 2>&1 &")
	s.must("exec", parent, "--", "sh", "-c", "sleep 0.5")
	s.must("exec", "--user", "root", parent, "--", "sh", "-c", "echo pre > /root/pre")
	res := s.fork(parent, 3)
	if res.Mode != "memory" {
		t.Fatalf("runsc fork mode %q (%s), want memory", res.Mode, res.Reason)
	}
	t.Logf("runsc memory fork of 3 in %d ms", res.Ms)
	for _, c := range append([]string{parent}, res.Sandboxes[0].ID, res.Sandboxes[1].ID, res.Sandboxes[2].ID) {
		out := s.must("exec", c, "--", "sh", "-c", "a=$(cat /tmp/counter); sleep 0.5; b=$(cat /tmp/counter); echo $a $b; hostname; echo $BERTH_SANDBOX_ID")
		f := strings.Fields(out)
		if len(f) != 4 {
			t.Fatalf("%s: counters, hostname and id: %q", c, out)
		}
		a, _ := strconv.Atoi(f[0])
		b, _ := strconv.Atoi(f[1])
		if a < 5 || b <= a {
			t.Errorf("%s: counter %d then %d: the process did not continue", c, a, b)
		}
		if f[2] != c || f[3] != c {
			t.Errorf("%s: hostname %q, BERTH_SANDBOX_ID %q", c, f[2], f[3])
		}
		if out := s.must("exec", "--user", "root", c, "--", "cat", "/root/pre"); out != "pre" {
			t.Errorf("%s: file written before the fork reads %q", c, out)
		}
	}
	// The files also survive a cold boot of a child (they are in its snapshot layer).
	child := res.Sandboxes[0].ID
	s.must("pause", child, "--mode", "disk")
	s.must("resume", child)
	if out := s.must("exec", "--user", "root", child, "--", "cat", "/root/pre"); out != "pre" {
		t.Errorf("after a disk pause the child reads %q", out)
	}
}
