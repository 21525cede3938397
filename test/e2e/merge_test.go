package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/testutil"
)

// mergeRun is `berth merge CHILD --into PARENT ... --json`: the merge and
// the exit code (4 when it waits for conflicts to be resolved).
func (s *server) mergeRun(child, parent string, extra ...string) (wire.Merge, int, string) {
	s.t.Helper()
	out, code := s.run(append([]string{"merge", child, "--into", parent, "--json"}, extra...)...)
	var m wire.Merge
	if (code == 0 || code == 4) && strings.HasPrefix(out, "{") {
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			s.t.Fatalf("merge output (exit %d): %v\n%s", code, err, out)
		}
	}
	return m, code, out
}

func (s *server) conflicts(parent string) []wire.Conflict {
	s.t.Helper()
	var l []wire.Conflict
	if err := json.Unmarshal([]byte(s.must("conflicts", parent, "--json")), &l); err != nil {
		s.t.Fatal(err)
	}
	return l
}

// rootSh runs sh -c script as root in id and returns its output.
func (s *server) rootSh(id, script string) string {
	s.t.Helper()
	return s.must("exec", "--user", "root", id, "--", "sh", "-c", script)
}

const fiveLines = "printf 'one\\ntwo\\nthree\\nfour\\nfive\\n' > /root/f"

// TestMergeRunc: three-way merges of forks into their parent on runc —
// clean line merge, a same-line conflict resolved either way, binary and
// delete-vs-edit conflicts, strategy theirs, one open merge per target and
// the attacks of a hostile source.
func TestMergeRunc(t *testing.T) { testMerge(t, "runc") }

// TestMergeRunsc is TestMergeRunc on runsc: the host cannot write the
// sentry's overlay, so the agent stages and commits (processes stopped
// with SIGSTOP instead of a cgroup freeze).
func TestMergeRunsc(t *testing.T) {
	requireRunsc(t)
	testMerge(t, "runsc")
}

func testMerge(t *testing.T, rt string) {
	s := startServer(t)
	if rt == "runsc" {
		if !strings.Contains(s.must("info"), "runsc") {
			testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
		}
		defer s.stopRunsc()
	}
	newFamily := func(setup string, n int) (string, []string) {
		t.Helper()
		parent := s.create("--runtime", rt)
		s.rootSh(parent, setup)
		res := s.fork(parent, n)
		var kids []string
		for _, c := range res.Sandboxes {
			kids = append(kids, c.ID)
		}
		return parent, kids
	}

	t.Run("clean line merge", func(t *testing.T) {
		parent, kids := newFamily(fiveLines+"; echo keep > /root/gone; echo held > /root/held", 1)
		child := kids[0]
		s.rootSh(child, "sed -i s/two/TWO/ /root/f; echo new > /root/added; mkdir -p /root/d/e; echo deep > /root/d/e/x; rm /root/gone")
		s.rootSh(parent, "sed -i s/four/FOUR/ /root/f")
		// A process of the target keeps the file the merge changes open.
		s.rootSh(parent, "(exec sleep 600 < /root/held) >/dev/null 2>&1 &")
		s.rootSh(child, "echo changed > /root/held")
		m, code, out := s.mergeRun(child, parent)
		if code != 0 || m.State != "applied" || m.Conflicts != 0 {
			t.Fatalf("merge: exit %d %s", code, out)
		}
		if len(m.OpenFiles) != 1 || m.OpenFiles[0].Path != "root/held" || m.OpenFiles[0].Cmd != "sleep" || m.OpenFiles[0].PID <= 0 {
			t.Errorf("open_files = %+v, want the sleep holding root/held", m.OpenFiles)
		}
		t.Logf("clean merge (%s): %d writes, %d deletes in %d ms, phases %v", rt, m.Writes, m.Deletes, m.Ms, m.PhasesMs)
		// Where the time went: every phase of a clean merge is measured,
		// and together they are no more than the whole.
		sum := 0.0
		for _, k := range []string{"capture", "plan", "store", "prepare", "journal", "stage", "freeze", "verify", "commit", "finish"} {
			v, ok := m.PhasesMs[k]
			if !ok || v < 0 {
				t.Errorf("phases_ms lacks %s: %v", k, m.PhasesMs)
			}
			sum += v
		}
		if sum > float64(m.Ms)+2 {
			t.Errorf("phases_ms add up to %.1f ms, more than the merge's %d ms", sum, m.Ms)
		}
		if got := s.rootSh(parent, "cat /root/f"); got != "one\nTWO\nthree\nFOUR\nfive" {
			t.Errorf("merged file reads %q", got)
		}
		if got := s.rootSh(parent, "cat /root/added /root/d/e/x; test -e /root/gone && echo still-there || echo gone"); got != "new\ndeep\ngone" {
			t.Errorf("added/deleted files: %q", got)
		}
		if got := s.rootSh(parent, "ls -a / | grep -c berth-merge || true"); got != "0" {
			t.Errorf("staging dir left in the target: %q", got)
		}
		// The child is unchanged and the merge is recorded.
		if got := s.rootSh(child, "cat /root/f"); got != "one\nTWO\nthree\nfour\nfive" {
			t.Errorf("child after the merge: %q", got)
		}
		if ev := s.must("events", parent); !strings.Contains(ev, "merge_applied") {
			t.Errorf("no merge_applied event:\n%s", ev)
		}
	})

	t.Run("same line conflict", func(t *testing.T) {
		for _, side := range []string{"ours", "theirs"} {
			t.Run(side, func(t *testing.T) {
				parent, kids := newFamily(fiveLines, 1)
				child := kids[0]
				s.rootSh(child, "sed -i s/three/CHILD/ /root/f")
				s.rootSh(parent, "sed -i s/three/PARENT/ /root/f")
				m, code, out := s.mergeRun(child, parent)
				if code != 4 || m.State != "conflicted" || m.Conflicts != 1 {
					t.Fatalf("merge: exit %d, %s", code, out)
				}
				l := s.conflicts(parent)
				if len(l) != 1 {
					t.Fatalf("conflicts: %+v", l)
				}
				c := l[0]
				if c.Path != "root/f" || c.Kind != "content" {
					t.Errorf("conflict %s %s", c.Path, c.Kind)
				}
				for v, want := range map[string]string{"base": "three", "ours": "PARENT", "theirs": "CHILD"} {
					if got := s.must("conflicts", parent, c.ID, "--show", v); !strings.Contains(got, want) {
						t.Errorf("--show %s: %q, want it to contain %q", v, got, want)
					}
				}
				if got := s.must("conflicts", parent, c.ID, "--show", "merged"); !strings.Contains(got, "<<<<<<<") {
					t.Errorf("--show merged has no markers: %q", got)
				}
				// A second merge into the same target waits for this one.
				if _, code, out := s.mergeRun(child, parent); code != 4 || !strings.Contains(out, "open merge") {
					t.Errorf("second merge while one is open: exit %d %s", code, out)
				}
				// Untouched until resolved.
				if got := s.rootSh(parent, "cat /root/f"); !strings.Contains(got, "PARENT") {
					t.Errorf("target changed before resolution: %q", got)
				}
				s.must("resolve", parent, c.ID, "--"+side)
				want := map[string]string{"ours": "PARENT", "theirs": "CHILD"}[side]
				if got := s.rootSh(parent, "sed -n 3p /root/f"); got != want {
					t.Errorf("after resolve --%s line 3 is %q, want %q", side, got, want)
				}
				var list []wire.Merge
				_ = json.Unmarshal([]byte(s.mustAPIList(parent)), &list)
				if len(list) == 0 || list[len(list)-1].State != "applied" {
					t.Errorf("merges after resolve: %+v", list)
				}
			})
		}
	})

	t.Run("binary conflict and delete vs edit", func(t *testing.T) {
		parent, kids := newFamily("printf 'A\\000B' > /root/bin; echo text > /root/t", 1)
		child := kids[0]
		s.rootSh(child, "printf 'C\\000D' > /root/bin; rm /root/t")
		s.rootSh(parent, "printf 'E\\000F' > /root/bin; echo edited > /root/t")
		m, code, out := s.mergeRun(child, parent)
		if code != 4 || m.Conflicts != 2 {
			t.Fatalf("merge: exit %d %s", code, out)
		}
		kinds := map[string]wire.Conflict{}
		for _, c := range s.conflicts(parent) {
			kinds[c.Path] = c
		}
		if kinds["root/bin"].Kind != "binary" || kinds["root/t"].Kind != "delete" {
			t.Fatalf("conflict kinds: %+v", kinds)
		}
		if kinds["root/bin"].Theirs.Node == nil || kinds["root/bin"].Theirs.Node.SHA256 == "" {
			t.Errorf("binary conflict without theirs' digest: %+v", kinds["root/bin"])
		}
		// By content for one, by side for the other: the merge applies after the last.
		f := filepath.Join(t.TempDir(), "r")
		os.WriteFile(f, []byte("resolved\n"), 0o600)
		s.must("resolve", parent, kinds["root/bin"].ID, "--file", f, "--mode", "0640")
		if got := s.rootSh(parent, "cat /root/bin | od -c | head -1"); !strings.Contains(got, "E") {
			t.Errorf("target changed with a conflict still open: %q", got)
		}
		s.must("resolve", parent, kinds["root/t"].ID, "--theirs")
		if got := s.rootSh(parent, "cat /root/bin; stat -c %a /root/bin; test -e /root/t && echo t-exists || echo t-gone"); got != "resolved\n640\nt-gone" {
			t.Errorf("after resolving: %q", got)
		}
	})

	t.Run("strategy theirs and abort", func(t *testing.T) {
		parent, kids := newFamily(fiveLines, 2)
		s.rootSh(kids[0], "sed -i s/one/CHILD/ /root/f")
		s.rootSh(parent, "sed -i s/one/PARENT/ /root/f")
		m, code, out := s.mergeRun(kids[0], parent, "--strategy", "theirs")
		if code != 0 || m.State != "applied" {
			t.Fatalf("merge --strategy theirs: exit %d %s", code, out)
		}
		if got := s.rootSh(parent, "head -1 /root/f"); got != "CHILD" {
			t.Errorf("strategy theirs: line 1 is %q", got)
		}
		s.rootSh(kids[1], "sed -i s/five/SIB/ /root/f")
		s.rootSh(parent, "sed -i s/five/PAR/ /root/f")
		if _, code, _ := s.mergeRun(kids[1], parent); code != 4 {
			t.Fatalf("conflicting merge: exit %d", code)
		}
		s.must("merge", "--abort", parent)
		if got := s.rootSh(parent, "tail -1 /root/f"); got != "PAR" {
			t.Errorf("after abort: %q", got)
		}
		if _, code, _ := s.mergeRun(kids[1], parent, "--strategy", "ours"); code != 0 {
			t.Errorf("merge after abort: exit %d", code)
		}
		if out, code := s.run("merge", kids[1], "--into", parent, "--strategy", "sideways"); code == 0 || !strings.Contains(out, "strategy") {
			t.Errorf("bad strategy: exit %d %s", code, out)
		}
		// Unrelated sandboxes have no common base.
		other := s.create("--runtime", rt)
		if out, code := s.run("merge", other, "--into", parent); code == 0 || !strings.Contains(out, "no common base") {
			t.Errorf("unrelated merge: exit %d %s", code, out)
		}
	})

	t.Run("deleting the target drops its open merge", func(t *testing.T) {
		parent, kids := newFamily(fiveLines, 1)
		s.rootSh(kids[0], "sed -i s/one/A/ /root/f")
		s.rootSh(parent, "sed -i s/one/B/ /root/f")
		if _, code, out := s.mergeRun(kids[0], parent); code != 4 {
			t.Fatalf("merge: exit %d %s", code, out)
		}
		captures := func() int {
			var list []wire.Snapshot
			if err := json.Unmarshal([]byte(s.must("snapshot", "ls", "--json")), &list); err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, sn := range list {
				if sn.SourceSandbox == kids[0] {
					n++
				}
			}
			return n
		}
		if n := captures(); n != 1 {
			t.Fatalf("captures of the child while the merge is open: %d, want 1", n)
		}
		s.must("rm", "-f", parent)
		if n := captures(); n != 0 {
			t.Errorf("captures of the child after its target was deleted: %d, want 0", n)
		}
		if _, err := os.Stat(filepath.Join(s.dataDir, "merges")); err == nil {
			if e, _ := os.ReadDir(filepath.Join(s.dataDir, "merges")); len(e) != 0 {
				t.Errorf("merge journals left: %v", e)
			}
		}
	})

	t.Run("hostile source and target", func(t *testing.T) {
		probes := []string{"/etc/x", "/etc/file", "/etc/0", "/etc/1", "/etc/2", "/etc/3"}
		existed := map[string]bool{}
		for _, p := range probes {
			_, err := os.Lstat(p)
			existed[p] = err == nil
		}
		shadow, _ := os.ReadFile("/etc/shadow")
		passwd, _ := os.ReadFile("/etc/passwd")
		parent, kids := newFamily("mkdir -p /root/etc; echo x > /root/etc/x", 1)
		child := kids[0]
		// Theirs plants symlinks pointing at host files and out of the tree,
		// and replaces a directory the target uses by a symlink.
		s.rootSh(child, "ln -s /etc/shadow /root/shadowlink; ln -s ../../../../../etc/passwd /root/up; rm -rf /root/etc; ln -s /etc /root/etc; "+
			"mkdir -p /root/w; echo payload > /root/w/file")
		// The target races a symlink into its staging dir while the merge stages.
		s.rootSh(parent, "(for i in $(seq 1 4000); do for d in /.berth-merge-*; do [ -d \"$d\" ] && rm -rf \"$d/new\" && ln -sfn /etc \"$d/new\"; done; done) >/dev/null 2>&1 &")
		m, code, out := s.mergeRun(child, parent, "--strategy", "theirs")
		t.Logf("hostile merge: exit %d state %s %s", code, m.State, strings.TrimSpace(out))
		if got, _ := os.ReadFile("/etc/shadow"); string(got) != string(shadow) {
			t.Fatal("host /etc/shadow changed")
		}
		if got, _ := os.ReadFile("/etc/passwd"); string(got) != string(passwd) {
			t.Fatal("host /etc/passwd changed")
		}
		for _, p := range probes {
			if _, err := os.Lstat(p); err == nil && !existed[p] {
				t.Errorf("host %s appeared", p)
			}
		}
		if code == 0 {
			// Applied: the links exist as links inside the target, pointing where theirs said.
			if got := s.rootSh(parent, "readlink /root/shadowlink; readlink /root/up; readlink /root/etc"); got != "/etc/shadow\n../../../../../etc/passwd\n/etc" {
				t.Errorf("symlinks in the target: %q", got)
			}
		}
	})
}

// mustAPIList is GET /v1/sandboxes/{id}/merges, the raw JSON array.
func (s *server) mustAPIList(id string) string {
	s.t.Helper()
	code, body := s.apiList(s.key, "GET", "/v1/sandboxes/"+id+"/merges")
	if code != 200 {
		s.t.Fatalf("list merges: %d %s", code, body)
	}
	return body
}

// TestMergeKilledMidCommit: the daemon is killed (-9) in the middle of a
// merge's commit; after the restart the target's files are exactly what
// they were before the merge, the target runs (thawed) and the merge is
// aborted with reason interrupted.
func TestMergeKilledMidCommit(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" {
				requireRunsc(t)
			}
			testMergeKilled(t, rt)
		})
	}
}

func testMergeKilled(t *testing.T, rt string) {
	t.Setenv("BERTH_TEST_MERGE_PAUSE", "60s")
	s := startServer(t)
	if rt == "runsc" {
		defer s.stopRunsc()
	}
	parent := s.create("--runtime", rt)
	s.rootSh(parent, fiveLines+"; for i in $(seq 1 20); do echo base$i > /root/n$i; done; echo old > /root/del")
	child := s.fork(parent, 1).Sandboxes[0].ID
	s.rootSh(child, "sed -i s/two/TWO/ /root/f; for i in $(seq 1 20); do echo child$i > /root/n$i; echo add$i > /root/a$i; done; rm /root/del")
	s.rootSh(parent, "sed -i s/four/FOUR/ /root/f")
	before := s.rootSh(parent, "cd /root && ls -la --full-time . | grep -v ' \\.\\.\\?$' | awk '{print $1, $3, $4, $5, $9}'; md5sum f n* del")
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.run("merge", child, "--into", parent)
	}()
	testutil.Eventually(t, testutil.Within(60*time.Second).Every(50*time.Millisecond), func() error {
		if !strings.Contains(s.logs(), "merge paused for a test") {
			return os.ErrNotExist
		}
		return nil
	})
	s.kill9()
	<-done
	os.Unsetenv("BERTH_TEST_MERGE_PAUSE")
	s.start()
	after := s.rootSh(parent, "cd /root && ls -la --full-time . | grep -v ' \\.\\.\\?$' | awk '{print $1, $3, $4, $5, $9}'; md5sum f n* del")
	if after != before {
		t.Errorf("target after an interrupted merge differs:\nbefore:\n%s\nafter:\n%s\n%s", before, after, s.logs())
	}
	if got := s.rootSh(parent, "ls -a / | grep -c berth-merge || true"); got != "0" {
		t.Errorf("staging dir left: %q", got)
	}
	var list []wire.Merge
	_ = json.Unmarshal([]byte(s.mustAPIList(parent)), &list)
	if len(list) != 1 || list[0].State != "aborted" || list[0].Reason != "interrupted" {
		t.Errorf("merge after recovery: %+v", list)
	}
	// The target accepts the merge again, and it applies.
	m, code, out := s.mergeRun(child, parent)
	if code != 0 || m.State != "applied" {
		t.Fatalf("merge after recovery: exit %d %s", code, out)
	}
	if got := s.rootSh(parent, "cat /root/f; cat /root/n7 /root/a3; test -e /root/del || echo del-gone"); got != "one\nTWO\nthree\nFOUR\nfive\nchild7\nadd3\ndel-gone" {
		t.Errorf("merge after recovery gives %q", got)
	}
}
