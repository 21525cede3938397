package e2e

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/bench"
	"github.com/berth-dev/berth/internal/testutil"
)

// checkpoint takes a checkpoint of id through the CLI.
func (s *server) checkpoint(key, id string, args ...string) wire.Checkpoint {
	s.t.Helper()
	out, stderr, code := s.runSplit(key, nil, append([]string{"checkpoint", id, "--json"}, args...)...)
	if code != 0 {
		s.t.Fatalf("berth checkpoint %s %v: exit %d: %s%s", id, args, code, out, stderr)
	}
	var c wire.Checkpoint
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		s.t.Fatalf("checkpoint output: %v\n%s", err, out)
	}
	return c
}

func (s *server) rewind(id, to string) wire.RewindResult {
	s.t.Helper()
	var r wire.RewindResult
	if err := json.Unmarshal([]byte(s.must("rewind", id, "--to", to, "--json")), &r); err != nil {
		s.t.Fatal(err)
	}
	return r
}

func (s *server) timeline(id string) wire.Timeline {
	s.t.Helper()
	var tl wire.Timeline
	if err := json.Unmarshal([]byte(s.must("timeline", id, "--json")), &tl); err != nil {
		s.t.Fatal(err)
	}
	return tl
}

func (s *server) sandbox(id string) wire.Sandbox {
	s.t.Helper()
	var sb wire.Sandbox
	if err := json.Unmarshal([]byte(s.must("inspect", id)), &sb); err != nil {
		s.t.Fatal(err)
	}
	return sb
}

// storedToken is the stored hash of a sandbox's envd access token.
func (s *server) storedToken(id string) string {
	s.t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(s.dataDir, "berth.db")+"?_pragma=query_only(1)")
	if err != nil {
		s.t.Fatal(err)
	}
	defer db.Close()
	var tok string
	if err := db.QueryRow(`SELECT access_token FROM sandboxes WHERE id = ?`, id).Scan(&tok); err != nil {
		s.t.Fatal(err)
	}
	return tok
}

// sameIdentity checks that a rewound or promoted sandbox kept its id, owner,
// expiry, network policy and token.
func sameIdentity(t *testing.T, s *server, before wire.Sandbox, tokenBefore string) {
	t.Helper()
	after := s.sandbox(before.ID)
	if after.State != "running" || after.Owner != before.Owner || !after.ExpiresAt.Equal(before.ExpiresAt) ||
		after.Extra["network_policy"] != before.Extra["network_policy"] || after.Runtime != before.Runtime {
		t.Errorf("identity changed:\nbefore %+v\nafter  %+v", before, after)
	}
	if tok := s.storedToken(before.ID); tok != tokenBefore {
		t.Errorf("access token hash %q, was %q", tok, tokenBefore)
	}
}

// TestTimelineRewindMemory: a process keeps a counter in memory and in a
// file; a checkpoint with memory, then the sandbox moves on; a rewind
// brings back the old counter process and the old files, same id, token,
// owner, expiry and policy. Where the runtime cannot checkpoint here, the
// checkpoint says files and why, and the rewind boots on its files.
func TestTimelineRewindMemory(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt, "--allow", "example.com")
			defer s.run("rm", id)
			before, token := s.sandbox(id), s.storedToken(id)
			startCounter(t, s, id)
			pid := counterPid(s, id)
			s.must("exec", id, "--", "sh", "-c", "echo one > /home/user/f")
			caps := checkpointCaps(t, s, rt)
			ck := s.checkpoint(s.key, id, "--memory", "--name", "m1")
			atCheckpoint := counter(s, id)
			want := "files"
			if caps.Checkpoint {
				want = "memory"
			}
			if ck.Mode != want || (want == "files" && ck.Reason == "") {
				t.Fatalf("checkpoint --memory on %s (can checkpoint: %v): mode %q reason %q", rt, caps.Checkpoint, ck.Mode, ck.Reason)
			}
			if got := counterPid(s, id); got != pid {
				t.Fatalf("the checkpoint restarted the counter (pid %q, was %q)", got, pid)
			}
			advanced := waitCounter(t, s, id, atCheckpoint+30)
			s.must("exec", id, "--", "sh", "-c", "echo two > /home/user/f; echo x > /home/user/later")
			res := s.rewind(id, "m1")
			t.Logf("%s: checkpoint --memory: mode %s %s; rewind: mode %s in %d ms %s", rt, ck.Mode, ck.Reason, res.Mode, res.Millis, res.Reason)
			if res.Mode != want || res.Checkpoint.ID != ck.ID || res.Sandbox.ID != id {
				t.Fatalf("rewind: %+v", res)
			}
			if out := s.must("exec", id, "--", "sh", "-c", "cat /home/user/f; ls /home/user"); out != "one\ncount.sh\nf" {
				t.Fatalf("files after rewind: %q", out)
			}
			sameIdentity(t, s, before, token)
			if want == "memory" {
				n := counter(s, id)
				if got := counterPid(s, id); got != pid {
					t.Fatalf("counter process %q after rewind, was %q", got, pid)
				}
				if n < 0 || n >= advanced {
					t.Fatalf("counter %d right after the rewind; it was %d at the checkpoint and %d before the rewind", n, atCheckpoint, advanced)
				}
				waitCounter(t, s, id, n+3) // and it goes on counting
			} else if got := counterPid(s, id); got != "" {
				t.Fatalf("a files-only rewind kept process %q", got)
			}
			evs := s.must("events", id, "--json")
			if !strings.Contains(evs, `"rewind"`) || !strings.Contains(evs, `"checkpoint_taken"`) {
				t.Errorf("no rewind / checkpoint events:\n%s", evs)
			}
		})
	}
}

// TestTimelineFileDeltas: three file-only checkpoints each changing files;
// each delta holds only its own changes (sizes), rewinding to the middle
// one shows exactly its files, the later one stays on the timeline, and a
// checkpoint after the rewind is a delta against the middle one.
func TestTimelineFileDeltas(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			defer s.run("rm", id)
			w := "/home/user/w"
			mk := func(name string, kib int) string {
				return "head -c " + strconv.Itoa(kib*1000) + " /dev/urandom > " + w + "/" + name
			}
			s.must("exec", id, "--", "sh", "-c", "mkdir "+w+" && "+mk("a", 100))
			c1 := s.checkpoint(s.key, id)
			s.must("exec", id, "--", "sh", "-c", mk("b", 200)+" && rm "+w+"/a")
			c2 := s.checkpoint(s.key, id, "--name", "middle")
			sumB := s.must("exec", id, "--", "sha256sum", w+"/b")
			s.must("exec", id, "--", "sh", "-c", mk("c", 300)+" && echo more >> "+w+"/b")
			c3 := s.checkpoint(s.key, id)
			// Each delta: its own new file's bytes, plus a little of the agent's
			// own bookkeeping; never the files of another checkpoint.
			const slack = 64 << 10
			for _, c := range []struct {
				ck       wire.Checkpoint
				min, max int64
			}{{c1, 100_000, 100_000 + slack}, {c2, 200_000, 200_000 + slack}, {c3, 300_000 + 200_005, 300_000 + 200_005 + slack}} {
				if c.ck.Mode != "files" || c.ck.Bytes < c.min || c.ck.Bytes >= c.max {
					t.Errorf("checkpoint #%d: mode %s, %d bytes; want files, [%d, %d)", c.ck.Seq, c.ck.Mode, c.ck.Bytes, c.min, c.max)
				}
			}
			if c2.Prev != c1.ID || c3.Prev != c2.ID || c1.Prev != "" || len(c3.Layers) != len(c1.Layers)+2 {
				t.Errorf("chain: c1 prev %q, c2 prev %q (want %s), c3 prev %q (want %s), layers %d / %d",
					c1.Prev, c2.Prev, c1.ID, c3.Prev, c2.ID, len(c1.Layers), len(c3.Layers))
			}
			res := s.rewind(id, "middle")
			t.Logf("%s: deltas %d/%d/%d bytes; rewind (files) in %d ms", rt, c1.Bytes, c2.Bytes, c3.Bytes, res.Millis)
			if res.Mode != "files" {
				t.Errorf("rewind to a files-only checkpoint: mode %s", res.Mode)
			}
			if out := s.must("exec", id, "--", "ls", w); out != "b" {
				t.Fatalf("after rewind to the middle checkpoint %s holds %q, want only b", w, out)
			}
			if got := s.must("exec", id, "--", "sha256sum", w+"/b"); got != sumB {
				t.Fatalf("b after rewind: %s, want %s", got, sumB)
			}
			tl := s.timeline(id)
			if len(tl.Checkpoints) != 3 || tl.Head != c2.ID {
				t.Fatalf("timeline after rewind: head %s, %d checkpoints", tl.Head, len(tl.Checkpoints))
			}
			// Diff against the later checkpoint (lineage's diff through the
			// timeline): from #3's view to now, c is gone and b lost its line.
			var d wire.DiffResult
			if err := json.Unmarshal([]byte(s.must("diff", id, "--checkpoint", c3.ID, "--json")), &d); err != nil {
				t.Fatal(err)
			}
			kinds := map[string]string{}
			for _, ch := range d.Changes {
				kinds[ch.Path] = ch.Kind
			}
			if kinds["home/user/w/c"] != "deleted" || kinds["home/user/w/b"] != "modified" {
				t.Errorf("diff against checkpoint #3 after the rewind: %v", kinds)
			}
			s.must("exec", id, "--", "sh", "-c", "echo d > "+w+"/d")
			c4 := s.checkpoint(s.key, id)
			if c4.Prev != c2.ID || c4.Bytes >= slack || c4.Seq != 4 {
				t.Errorf("checkpoint after the rewind: prev %q (want %s), %d bytes, seq %d", c4.Prev, c2.ID, c4.Bytes, c4.Seq)
			}
			// Rewind forward again, to the last checkpoint before the rewind.
			s.rewind(id, strconv.FormatInt(c3.Seq, 10))
			if out := s.must("exec", id, "--", "ls", w); out != "b\nc" {
				t.Fatalf("after rewind to #3: %q", out)
			}
		})
	}
}

// TestTimelineQuotaAndDelete: checkpoints count in the owner's snapshot
// quota; deleting one frees its unit; deleting the sandbox removes its
// checkpoints, their memory images and their delta layers.
func TestTimelineQuotaAndDelete(t *testing.T) {
	s := startServer(t)
	alice := s.must("key", "create", "--owner", "alice")
	s.must("quota", "set", "alice", "--sandboxes", "2", "--snapshots", "2")
	out, code := s.runAs(alice, nil, "create", "--template", "tiny")
	if code != 0 {
		t.Fatal(out)
	}
	id := strings.TrimSpace(out)
	layersBefore := dirNames(t, filepath.Join(s.dataDir, "layers"))
	s.must("exec", id, "--", "sh", "-c", "echo 1 > /home/user/1")
	c1 := s.checkpoint(alice, id, "--memory")
	s.must("exec", id, "--", "sh", "-c", "echo 2 > /home/user/2")
	s.checkpoint(alice, id)
	if out, code := s.runAs(alice, nil, "checkpoint", id); code == 0 || !strings.Contains(out, "snapshots") {
		t.Fatalf("third checkpoint over a quota of 2: exit %d: %s", code, out)
	}
	if out, code := s.runAs(alice, nil, "snapshot", id); code == 0 {
		t.Fatalf("a snapshot over a quota full of checkpoints: %s", out)
	}
	s.must("checkpoint", "rm", id, c1.ID)
	s.must("exec", id, "--", "sh", "-c", "echo 3 > /home/user/3")
	c3 := s.checkpoint(alice, id, "--memory")
	if len(s.timeline(id).Checkpoints) != 2 {
		t.Fatalf("timeline: %+v", s.timeline(id))
	}
	// Another owner sees none of it.
	bob := s.must("key", "create", "--owner", "bob")
	if out, code := s.runAs(bob, nil, "timeline", id); code == 0 {
		t.Fatalf("bob reads alice's timeline: %s", out)
	}
	if c3.Mode == "memory" {
		if _, err := os.Stat(filepath.Join(s.dataDir, "checkpoints", c3.ID, "memory")); err != nil {
			t.Fatalf("memory image of %s: %v", c3.ID, err)
		}
	}
	if added := len(dirNames(t, filepath.Join(s.dataDir, "layers"))) - len(layersBefore); added < 2 {
		t.Fatalf("%d delta layers stored for 2 checkpoints", added)
	}
	s.must("rm", id)
	// The checkpoints go with the rest of the teardown, after the answer
	// (internal/daemon/teardown.go).
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		if after := dirNames(t, filepath.Join(s.dataDir, "layers")); strings.Join(after, ",") != strings.Join(layersBefore, ",") {
			return fmt.Errorf("layers after deleting the sandbox: %v, before its checkpoints: %v", after, layersBefore)
		}
		if left := dirNames(t, filepath.Join(s.dataDir, "checkpoints")); len(left) != 0 {
			return fmt.Errorf("checkpoint dirs left: %v", left)
		}
		return nil
	})
	if code, _ := s.api(s.key, "GET", "/v1/sandboxes/"+id+"/checkpoints", nil); code != 404 {
		t.Errorf("timeline of a deleted sandbox: %d", code)
	}
	// The units are free again.
	out, code = s.runAs(alice, nil, "create", "--template", "tiny")
	if code != 0 {
		t.Fatal(out)
	}
	s.checkpoint(alice, strings.TrimSpace(out))
	s.checkpoint(alice, strings.TrimSpace(out))
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if !strings.HasPrefix(e.Name(), ".") && !strings.HasSuffix(e.Name(), ".json") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestTimelinePromote: one of three forks is promoted with
// --discard-others: the parent keeps its identity and takes the child's
// files (and its processes where the runtime can), the other children go,
// the promoted child stays.
func TestTimelinePromote(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			parent := s.create("--runtime", rt)
			defer s.run("rm", parent)
			before, token := s.sandbox(parent), s.storedToken(parent)
			s.must("exec", "--user", "root", parent, "--", "sh", "-c", "echo 0123456789abcdef0123456789abcdef > /etc/machine-id")
			s.must("exec", parent, "--", "sh", "-c", "echo base > /home/user/base; echo parent > /home/user/who")
			res := s.fork(parent, 3)
			var kids []string
			for i, c := range res.Sandboxes {
				kids = append(kids, c.ID)
				s.must("exec", c.ID, "--", "sh", "-c", "echo child"+strconv.Itoa(i)+" > /home/user/who")
			}
			chosen := kids[1]
			if out := s.must("exec", chosen, "--", "cat", "/etc/machine-id"); out == "0123456789abcdef0123456789abcdef" {
				t.Fatalf("the fork child kept its parent's machine-id: the check below would prove nothing")
			}
			startCounter(t, s, chosen)
			pid := counterPid(s, chosen)
			var pr wire.PromoteChildResult
			if err := json.Unmarshal([]byte(s.must("promote", chosen, "--discard-others", "--json")), &pr); err != nil {
				t.Fatal(err)
			}
			want := "files"
			if checkpointCaps(t, s, rt).Checkpoint {
				want = "memory"
			}
			t.Logf("%s: promote: mode %s in %d ms %s", rt, pr.Mode, pr.Millis, pr.Reason)
			if pr.Parent.ID != parent || pr.From != chosen || pr.Mode != want || len(pr.Discarded) != 2 {
				t.Fatalf("promote: %+v (want mode %s, 2 discarded)", pr, want)
			}
			if out := s.must("exec", parent, "--", "sh", "-c", "cat /home/user/base /home/user/who"); out != "base\nchild1" {
				t.Fatalf("parent after promote: %q", out)
			}
			sameIdentity(t, s, before, token)
			if out := s.must("exec", parent, "--", "sh", "-c", "hostname; echo $BERTH_SANDBOX_ID; cat /etc/machine-id"); out != parent+"\n"+parent+"\n0123456789abcdef0123456789abcdef" {
				t.Errorf("parent after promote calls itself %q, want %s and its own machine-id", out, parent)
			}
			if want == "memory" {
				if got := counterPid(s, parent); got != pid {
					t.Errorf("the child's counter (pid %s) is not running in the parent (%q)", pid, got)
				}
			}
			for _, k := range []string{kids[0], kids[2]} {
				if out, code := s.run("inspect", k); code == 0 && !strings.Contains(out, `"deleted"`) {
					t.Errorf("child %s not discarded: %s", k, out)
				}
			}
			if out := s.must("exec", chosen, "--", "cat", "/home/user/who"); out != "child1" {
				t.Errorf("promoted child after promote: %q", out)
			}
			if evs := s.must("events", parent, "--json"); !strings.Contains(evs, `"promote"`) {
				t.Errorf("no promote event:\n%s", evs)
			}
			s.run("rm", chosen)
		})
	}
}

// TestTimelineHostileDelta: the sandbox's root plants symlinks to host
// paths, device nodes and hard links between checkpoints (and swaps a
// directory of the previous checkpoint for a symlink to /etc). The delta
// writer never follows them: no device node in any layer, symlinks stay
// symlinks, no host file is copied or touched, and a rewind works.
func TestTimelineHostileDelta(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	hostFiles := []string{"/etc/passwd", "/etc/shadow", "/etc/hostname"}
	sums := map[string]string{}
	for _, f := range hostFiles {
		sums[f] = fileState(t, f)
	}
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			defer s.run("rm", id)
			root := func(cmd string) { s.run("exec", "--user", "root", id, "--", "sh", "-c", cmd) }
			root("mkdir -p /home/user/d && echo inside > /home/user/d/f")
			c1 := s.checkpoint(s.key, id)
			root("rm -rf /home/user/d && ln -s /etc /home/user/d; ln -s /etc/shadow /home/user/shadow; " +
				"ln -s ../../../../../../../../etc/passwd /home/user/rel; ln /etc/passwd /root/hard; " +
				"mknod /home/user/sda b 8 0; mknod /home/user/mem c 1 1; mkfifo /home/user/fifo; " +
				"echo pwned > /home/user/d/planted")
			c2 := s.checkpoint(s.key, id)
			checkDeltaLayer(t, filepath.Join(s.dataDir, "layers", c1.Layer), "")
			// In the second delta d is a symlink: nothing may sit below it.
			checkDeltaLayer(t, filepath.Join(s.dataDir, "layers", c2.Layer), "/home/user/d/")
			l2 := filepath.Join(s.dataDir, "layers", c2.Layer, "home", "user")
			for name, target := range map[string]string{"d": "/etc", "shadow": "/etc/shadow"} {
				if got, err := os.Readlink(filepath.Join(l2, name)); err != nil || got != target {
					t.Errorf("%s in the delta: %q, %v; want the symlink to %s", name, got, err, target)
				}
			}
			for _, f := range hostFiles {
				if got := fileState(t, f); got != sums[f] {
					t.Errorf("host %s changed: %s, was %s", f, got, sums[f])
				}
			}
			s.rewind(id, c1.ID)
			if out := s.must("exec", id, "--", "cat", "/home/user/d/f"); out != "inside" {
				t.Errorf("after rewind to #1: %q", out)
			}
			s.rewind(id, c2.ID)
			if out, _ := s.run("exec", id, "--", "readlink", "/home/user/d"); strings.TrimSpace(out) != "/etc" {
				t.Errorf("after rewind to #2 d is %q", out)
			}
		})
	}
	for _, f := range hostFiles {
		if got := fileState(t, f); got != sums[f] {
			t.Errorf("host %s changed: %s, was %s", f, got, sums[f])
		}
	}
}

// fileState is a host file's content digest, mode, owner and mtime.
func fileState(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		return "missing"
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]) + " " + strconv.FormatUint(uint64(st.Mode), 8) + " " +
		strconv.Itoa(int(st.Uid)) + " " + time.Unix(st.Mtim.Unix()).UTC().Format(time.RFC3339Nano)
}

// checkDeltaLayer walks a stored delta layer: no device node but
// whiteouts (0/0), and nothing below noneBelow (a path that is a symlink
// in the layer: an entry below it would be a host path followed).
func checkDeltaLayer(t *testing.T, dir, noneBelow string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFBLK:
			t.Errorf("block device in layer: %s", p)
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				t.Errorf("character device %d in layer: %s", st.Rdev, p)
			}
		}
		if noneBelow != "" && strings.Contains(p, noneBelow) {
			t.Errorf("layer holds a path below the symlink %s: %s", noneBelow, p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
}

// TestBenchTimeline runs the timeline's `berth bench` rows end to end on
// both runtimes and checks the report's shape (timings are logged, never
// asserted): 3 samples each, the host-copy and same-run cold-create
// baselines with a ratio, and the 100 MiB delta.
func TestBenchTimeline(t *testing.T) {
	requireRunsc(t)
	testutil.RequireRoot(t)
	bin := testutil.BuildBinaries(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "berth"), "bench", "--self", "--runs", "3", "--runtime", "both",
		"--only", "checkpoint-files,rewind-files", "--json", out)
	cmd.Env = append(os.Environ(), "BERTH_URL=http://127.0.0.1:1", "BERTH_API_KEY=unused")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("berth bench: %v\n%s", err, b)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, m := range rep.Metrics {
		seen++
		if !m.Available || len(m.Samples) != 3 || m.Summary == nil || m.Baseline == nil || !m.Baseline.Available || m.Ratio == nil {
			t.Errorf("%s/%s: want 3 samples, a baseline and a ratio: %+v", m.Name, m.Runtime, m)
			continue
		}
		t.Logf("%s/%s: p50 %.1f ms (min %.1f, max %.1f); baseline %s p50 %.1f ms; ratio %.2f; %v",
			m.Name, m.Runtime, m.Summary.P50, m.Summary.Min, m.Summary.Max, m.Baseline.Name, m.Baseline.Summary.P50, *m.Ratio, m.Derived)
		if m.Name == "checkpoint-files" && m.Derived["delta_mib"] < 100 {
			t.Errorf("checkpoint-files/%s: delta %.1f MiB, want ≥ 100", m.Runtime, m.Derived["delta_mib"])
		}
	}
	if seen != 4 {
		t.Errorf("%d metrics in the report, want 4 (2 rows × 2 runtimes)", seen)
	}
}

// TestTimelineMemoryDegradesHonestly: a memory checkpoint that cannot be
// taken (no CRIU for runc) is a files-only checkpoint that says why, in
// the answer and the event; a rewind to it boots on its files.
func TestTimelineMemoryDegradesHonestly(t *testing.T) {
	t.Setenv("BERTH_CRIU", "/nonexistent/criu")
	s := startServer(t)
	id := s.create("--runtime", "runc")
	s.must("exec", id, "--", "sh", "-c", "echo kept > /home/user/f")
	ck := s.checkpoint(s.key, id, "--memory")
	if ck.Mode != "files" || ck.Reason == "" {
		t.Fatalf("checkpoint --memory without CRIU: mode %q reason %q", ck.Mode, ck.Reason)
	}
	var evs []wire.Event
	if err := json.Unmarshal([]byte(s.must("events", id, "--json")), &evs); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		if e.Reason == "checkpoint_taken" && e.Data["requested"] == "memory" && e.Data["mode"] == "files" && e.Message == ck.Reason {
			found = true
		}
	}
	if !found {
		t.Fatalf("no checkpoint_taken event saying memory was asked for and files taken, and why: %+v", evs)
	}
	s.must("exec", id, "--", "sh", "-c", "echo changed > /home/user/f")
	if res := s.rewind(id, ck.ID); res.Mode != "files" {
		t.Fatalf("rewind: %+v", res)
	}
	if out := s.must("exec", id, "--", "cat", "/home/user/f"); out != "kept" {
		t.Fatalf("after rewind: %q", out)
	}
}

// TestTimelineRepeatedDeltas: checkpoints whose deltas hold the same
// changes (none at all; a file set back to an earlier content) are still
// distinct layers, so every view mounts and every rewind lands.
func TestTimelineRepeatedDeltas(t *testing.T) {
	s := startServer(t)
	id := s.create("--runtime", "runc")
	s.must("exec", id, "--", "sh", "-c", "echo 1 > /home/user/v")
	c1 := s.checkpoint(s.key, id)
	c2 := s.checkpoint(s.key, id) // nothing changed
	s.must("exec", id, "--", "sh", "-c", "echo 2 > /home/user/v")
	c3 := s.checkpoint(s.key, id)
	s.must("exec", id, "--", "sh", "-c", "echo 1 > /home/user/v")
	c4 := s.checkpoint(s.key, id) // the same change as c1's... against c3
	s.must("exec", id, "--", "sh", "-c", "echo 2 > /home/user/v")
	c5 := s.checkpoint(s.key, id) // ... and as c3's
	seen := map[string]bool{}
	for _, c := range []wire.Checkpoint{c1, c2, c3, c4, c5} {
		if seen[c.Layer] {
			t.Errorf("checkpoint #%d shares its delta layer %s", c.Seq, c.Layer)
		}
		seen[c.Layer] = true
	}
	for _, c := range []struct {
		ck   wire.Checkpoint
		want string
	}{{c5, "2"}, {c4, "1"}, {c2, "1"}, {c3, "2"}, {c1, "1"}} {
		if res := s.rewind(id, c.ck.ID); res.Mode != "files" {
			t.Fatalf("rewind to #%d: %+v", c.ck.Seq, res)
		}
		if out := s.must("exec", id, "--", "cat", "/home/user/v"); out != c.want {
			t.Errorf("after rewind to #%d: v = %q, want %s", c.ck.Seq, out, c.want)
		}
	}
}

// TestTimelineRewindSurvivesKill9: the daemon is killed (-9) in the middle
// of a rewind — as soon as its restart journal is written, as soon as the
// workspace is set aside, and while the fresh workspace image is being
// formatted. After a restart the sandbox is never half: the interrupted
// restart is settled (an event says so), no workspace is left aside, and
// once running (started again if the restart found it dead) it holds
// either the state it had before the rewind or the checkpoint's, never a
// mix and never an empty disk. The server keeps no workspace spares, so
// each rewind formats its image (the window disk.img.new marks); a spare
// is renamed straight to disk.img, the state the mkfs path reaches with
// its own rename.
func TestTimelineRewindSurvivesKill9(t *testing.T) {
	s := startServer(t, "--workspace-spares", "0")
	for _, at := range []string{"timeline-restart.json", "disk.img.timeline", "disk.img.new"} {
		t.Run(at, func(t *testing.T) {
			id := s.create("--runtime", "runc")
			defer s.run("rm", id)
			s.must("exec", id, "--", "sh", "-c", "echo checkpoint > /home/user/state")
			ck := s.checkpoint(s.key, id)
			mark := filepath.Join(s.dataDir, "sandboxes", id, at)
			// The scratch image lives for the few milliseconds of mkfs, so a
			// rewind may end before the poll sees it: rewind again, up to
			// ten times, until the kill lands inside the window.
			caught, attempts := false, 0
			for ; attempts < 10 && !caught; attempts++ {
				s.must("exec", id, "--", "sh", "-c", "echo later > /home/user/state; echo later > /home/user/later")
				cmd := exec.Command(filepath.Join(s.bin, "berth"), "rewind", id, "--to", ck.ID)
				cmd.Env = s.env(s.key)
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- cmd.Wait() }()
				deadline := time.After(30 * time.Second)
			poll:
				for {
					if _, err := os.Stat(mark); err == nil {
						caught = true
						break
					}
					select {
					case err := <-done:
						if err != nil {
							t.Fatalf("rewind ended before %s appeared: %v", at, err)
						}
						break poll
					case <-deadline:
						t.Fatalf("%s never appeared and the rewind did not end", at)
					default:
						time.Sleep(200 * time.Microsecond)
					}
				}
				if caught {
					s.kill9()
					<-done
				}
			}
			if !caught {
				t.Fatalf("%s never seen in 10 rewinds", at)
			}
			t.Logf("killed at %s during rewind #%d", at, attempts)
			s.start()
			if _, err := os.Stat(filepath.Join(s.dataDir, "sandboxes", id, "disk.img.timeline")); !os.IsNotExist(err) {
				t.Errorf("workspace left aside after the restart: %v", err)
			}
			if !strings.Contains(s.must("events", id, "--json"), "restart_settled") {
				t.Errorf("no restart_settled event")
			}
			if v := inspect(t, s, id); v.State != "running" {
				s.must("start", id)
			}
			out := s.must("exec", id, "--", "sh", "-c", "cat /home/user/state; ls /home/user")
			switch out {
			case "checkpoint\nstate", "later\nlater\nstate":
				t.Logf("killed at %s: the sandbox holds %q", at, strings.SplitN(out, "\n", 2)[0])
			default:
				t.Fatalf("killed at %s: the sandbox holds %q: neither the old state nor the checkpoint's", at, out)
			}
		})
	}
}
