package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/bench"
	"github.com/berth-dev/berth/internal/testutil"
)

func (s *server) diffJSON(args ...string) wire.DiffResult {
	s.t.Helper()
	out := s.must(append([]string{"diff", "--json"}, args...)...)
	var res wire.DiffResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		s.t.Fatalf("diff --json: %v\n%s", err, out)
	}
	return res
}

// changeLines is "kind path" per change, with what else the test checks.
func changeLines(res wire.DiffResult) []string {
	var out []string
	for _, c := range res.Changes {
		l := c.Kind + " " + c.Path
		if c.ModeChanged {
			l += fmt.Sprintf(" mode %o->%o", c.Old.Mode, c.New.Mode)
		}
		if c.New != nil && c.New.Type == "symlink" {
			l += " -> " + c.New.Target
		}
		if c.OwnerChanged {
			l += fmt.Sprintf(" owner %d:%d->%d:%d", c.Old.UID, c.Old.GID, c.New.UID, c.New.GID)
		}
		if c.New != nil && (c.New.UID != 0 || c.New.GID != 0) {
			l += fmt.Sprintf(" uid %d gid %d", c.New.UID, c.New.GID) // root wrote everything, as seen inside
		}
		if c.RenamedTo != "" {
			l += " renamed_to " + c.RenamedTo
		}
		if c.RenamedFrom != "" {
			l += " renamed_from " + c.RenamedFrom
		}
		if c.Refused != "" {
			l += " refused"
		}
		if c.LinesAdded+c.LinesRemoved > 0 {
			l += fmt.Sprintf(" +%d-%d", c.LinesAdded, c.LinesRemoved)
		}
		out = append(out, l)
	}
	return out
}

func wantLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %q\n want %q", what, got, want)
	}
}

// unrelatedTemplate imports a template whose one layer differs from tiny's.
func unrelatedTemplate(t *testing.T, s *server) {
	t.Helper()
	dir := t.TempDir()
	tarPath := filepath.Join(dir, "other.tar")
	b, err := os.ReadFile(tinyTar(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tarPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "unrelated"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-rf", tarPath, "-C", dir, "./unrelated").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	s.must("template", "import", "other", tarPath)
}

// TestDiffForks (runc and runsc): a fork writes, edits, deletes, renames,
// chmods and symlinks → the diff lists exactly that, as JSON and --stat;
// two forks diff against each other; an unrelated sandbox is "no common
// base"; compare with a check over three children (one fails); another
// owner can neither diff nor compare; a root inside a child plants a
// symlink to /etc/shadow, a FIFO, a device node and a huge sparse file,
// and the diff reports them without reading them or hanging.
func TestDiffForks(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			s := startServer(t)
			if rt == "runsc" {
				requireRunsc(t)
				if !strings.Contains(s.must("info"), "runsc") {
					testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
				}
				defer s.stopRunsc()
			}
			diffForks(t, s, rt)
		})
	}
}

func diffForks(t *testing.T, s *server, rt string) {
	parent := s.create("--runtime", rt)
	s.must("exec", "--user", "root", parent, "--", "sh", "-c",
		"mkdir -p /work && cd /work && printf 'one\\ntwo\\nthree\\n' > edit.txt && echo gone > del.txt && echo moving > old.txt && echo '#!/bin/sh' > run.sh && chmod 644 run.sh && echo same > keep.txt")
	res := s.fork(parent, 3)
	c1, c2, c3 := res.Sandboxes[0].ID, res.Sandboxes[1].ID, res.Sandboxes[2].ID

	s.must("exec", "--user", "root", c1, "--", "sh", "-c",
		"cd /work && echo four >> edit.txt && rm del.txt && mv old.txt new.txt && chmod 755 run.sh && ln -s edit.txt link && echo hi > added.txt")
	want := []string{
		"added work/added.txt +1-0",
		"deleted work/del.txt +0-1",
		"modified work/edit.txt +1-0",
		"added work/link -> edit.txt",
		"added work/new.txt renamed_from work/old.txt +1-0",
		"deleted work/old.txt renamed_to work/new.txt +0-1",
		"modified work/run.sh mode 644->755",
	}
	got := s.diffJSON(c1, "--path", "work")
	wantLines(t, "diff of a fork since its fork point", changeLines(got), want)
	if got.Stat.Files != 7 || got.Stat.Added != 3 || got.Stat.Deleted != 2 || got.Stat.Modified != 2 {
		t.Errorf("stat %+v", got.Stat)
	}
	for _, c := range got.Changes {
		if c.Path == "work/edit.txt" && !strings.Contains(c.Unified, "+four") {
			t.Errorf("edit.txt unified diff: %q", c.Unified)
		}
	}
	stat := s.must("diff", c1, "--stat", "--", "work")
	for _, w := range []string{"work/edit.txt", "| modified, +1 -0", "work/link", "symlink -> edit.txt", "mode 0644 -> 0755",
		"7 paths changed (3 added, 2 deleted, 2 modified), 3 insertions(+), 2 deletions(-)"} {
		if !strings.Contains(stat, w) {
			t.Errorf("diff --stat lacks %q:\n%s", w, stat)
		}
	}
	if patch := s.must("diff", c1, "work/edit.txt"); !strings.Contains(patch, "+four") || strings.Contains(patch, "run.sh") {
		t.Errorf("diff with a path: %s", patch)
	}

	// Two forks of one snapshot: only their uppers differ.
	s.must("exec", "--user", "root", c2, "--", "sh", "-c", "echo two > /work/c2.txt")
	wantLines(t, "diff of two forks", changeLines(s.diffJSON(c1, c2, "--path", "work", "--stat")), []string{
		"deleted work/added.txt +0-1",
		"added work/c2.txt +1-0",
		"added work/del.txt +1-0",
		"modified work/edit.txt +0-1",
		"deleted work/link",
		"deleted work/new.txt renamed_to work/old.txt +0-1",
		"added work/old.txt renamed_from work/new.txt +1-0",
		"modified work/run.sh mode 755->644",
	})

	// A stopped sandbox: its workspace image is read read-only under its
	// lock; afterwards it starts as before (no loop device left behind).
	s.must("stop", c1)
	wantLines(t, "diff of a stopped fork", changeLines(s.diffJSON(c1, "--path", "work")), want)
	if got := changeLines(s.diffJSON(c2, c1, "--path", "work", "--stat")); len(got) != 8 {
		t.Errorf("diff of a running fork against a stopped one: %q", got)
	}
	s.must("start", c1)
	if out := s.must("exec", c1, "--", "cat", "/work/added.txt"); out != "hi" {
		t.Errorf("the stopped fork after its diff and a start: %q", out)
	}

	// Unrelated: another template's sandbox shares no layer.
	unrelatedTemplate(t, s)
	other := s.must("create", "--template", "other", "--runtime", rt)
	if out, code := s.run("diff", c1, other); code != 4 || !strings.Contains(out, "no common base") {
		t.Errorf("diff of unrelated sandboxes: exit %d: %s", code, out)
	}
	if code, body := s.api(s.key, "GET", "/v1/sandboxes/"+c1+"/diff?against="+other, nil); code != http.StatusConflict || body["reason"] != "failed_precondition" {
		t.Errorf("API diff of unrelated sandboxes: %d %v", code, body)
	}
	if code, body := s.api(s.key, "GET", "/v1/sandboxes/"+c1+"/diff?against=checkpoint:nope", nil); code != http.StatusNotFound {
		t.Errorf("diff against a checkpoint nobody made: %d %v", code, body)
	}
	if code, body := s.api(s.key, "GET", "/v1/sandboxes/"+c1+"/diff?against=../x", nil); code != http.StatusBadRequest || body["field"] != "against" {
		t.Errorf("diff against a bad id: %d %v", code, body)
	}

	// Compare: c3 fails the check; passing first, then by diff size.
	s.must("exec", "--user", "root", c3, "--", "sh", "-c", "touch /work/fail")
	out := s.must("compare", parent, "--check", "echo checking; test ! -e /work/fail", "--timeout", "1m", "--json")
	var cmp wire.CompareResult
	if err := json.Unmarshal([]byte(out), &cmp); err != nil {
		t.Fatalf("compare: %v\n%s", err, out)
	}
	var order []string
	for _, ch := range cmp.Children {
		v := "?"
		if ch.Check != nil {
			v = fmt.Sprint(ch.Check.ExitCode)
			if !strings.Contains(ch.Check.OutputTail, "checking") {
				t.Errorf("child %s output tail %q", ch.ID, ch.Check.OutputTail)
			}
		}
		if ch.Stat == nil || ch.Cost == nil || ch.Error != "" {
			t.Errorf("child %s: stat %v cost %v error %q", ch.ID, ch.Stat, ch.Cost, ch.Error)
		}
		order = append(order, ch.ID+":"+v)
	}
	wantLines(t, "compare order", order, []string{c2 + ":0", c1 + ":0", c3 + ":1"})
	if table := s.must("compare", parent, "--check", "test ! -e /work/fail"); !strings.Contains(table, "fail (1)") || !strings.Contains(table, "pass") || strings.Contains(table, "error") {
		t.Errorf("compare table:\n%s", table)
	}

	// Another owner sees none of it.
	bob := s.must("key", "create", "--owner", "bob")
	for _, args := range [][]string{{"diff", c1}, {"diff", c1, c2}, {"compare", parent}} {
		if out, code := s.runAs(bob, nil, args...); code != 3 {
			t.Errorf("bob: berth %s: exit %d, want 3 (not found): %s", strings.Join(args, " "), code, out)
		}
	}

	// Attack: a root inside c3 plants what the host must never read: a
	// symlink to the host's /etc/shadow and one climbing out, a FIFO, a
	// device node (refused by both runtimes' user namespaces, reported
	// if it exists), a sparse file of terabytes and a 3 MiB binary.
	s.must("exec", "--user", "root", c3, "--", "sh", "-c",
		"cd /work; ln -s /etc/shadow shadow; ln -s ../../../../../../etc/passwd up; mkfifo fifo 2>/dev/null; mknod dev c 1 3 2>/dev/null; "+
			"truncate -s 8T huge 2>/dev/null || truncate -s 1T huge 2>/dev/null || truncate -s 64G huge; dd if=/dev/zero of=big bs=1M count=3 2>/dev/null; true")
	exists := func(p string) bool {
		return s.must("exec", "--user", "root", c3, "--", "sh", "-c", "test -e "+p+" && echo yes || echo no") == "yes"
	}
	hasDev, hasFifo := exists("/work/dev"), exists("/work/fifo")
	hugeSize := s.must("exec", "--user", "root", c3, "--", "sh", "-c", "stat -c %s /work/huge")
	t.Logf("%s: planted a device node: %v, a FIFO: %v, a sparse file of %s bytes", rt, hasDev, hasFifo, hugeSize)
	start := time.Now()
	code, body := s.api(s.key, "GET", "/v1/sandboxes/"+c3+"/diff?path=work", nil)
	took := time.Since(start)
	if took > 10*time.Second {
		t.Errorf("diff with a sparse file of %s bytes took %s", hugeSize, took)
	}
	if code != http.StatusTooManyRequests || body["reason"] != "resource_exhausted" {
		t.Errorf("diff reading a sparse file of %s bytes: %d %v, want 429 resource_exhausted", hugeSize, code, body)
	}
	t.Logf("%s: diff with a sparse file of %s bytes refused in %s", rt, hugeSize, took)
	s.must("exec", "--user", "root", c3, "--", "rm", "/work/huge")
	got = s.diffJSON(c3, "--path", "work", "--max-text", "1024")
	lines := changeLines(got)
	wantAttack := []string{"added work/big"}
	if hasDev {
		wantAttack = append(wantAttack, "added work/dev refused")
	}
	wantAttack = append(wantAttack, "added work/fail")
	// runsc (--overlay2=none) keeps a FIFO in the sentry: the host upper
	// never holds it, so the diff cannot see it.
	if hasFifo && rt == "runc" {
		wantAttack = append(wantAttack, "added work/fifo")
	}
	wantAttack = append(wantAttack, "added work/shadow -> /etc/shadow", "added work/up -> ../../../../../../etc/passwd")
	wantLines(t, "planted objects", lines, wantAttack)
	// A tree that changes while it is read: c2 creates and removes files
	// as fast as it can; every diff still answers.
	s.must("exec", "--user", "root", c2, "--", "sh", "-c",
		"(i=0; while true; do mkdir -p /tmp/churn; echo $i > /tmp/churn/f$i; rm -f /tmp/churn/f$((i-1)); i=$((i+1)); done) >/dev/null 2>&1 &")
	answered := 0
	for i := 0; i < 10; i++ {
		code, body := s.api(s.key, "GET", "/v1/sandboxes/"+c2+"/diff", nil)
		switch {
		case code == http.StatusOK:
			answered++
		case code == http.StatusServiceUnavailable && body["reason"] == "unavailable":
			t.Logf("diff %d of a churning sandbox: %v", i, body["message"])
		default:
			t.Errorf("diff %d of a churning sandbox: %d %v, want 200 (or 503 'kept changing')", i, code, body)
		}
	}
	if answered < 5 {
		t.Errorf("only %d of 10 diffs of a churning sandbox answered", answered)
	}
	t.Logf("%s: %d of 10 diffs of a churning sandbox answered", rt, answered)
	shadow, _ := os.ReadFile("/etc/shadow")
	for _, c := range got.Changes {
		if c.Unified != "" && len(shadow) > 0 && strings.Contains(c.Unified, string(shadow[:min(len(shadow), 20)])) {
			t.Errorf("%s: the host's /etc/shadow leaked into the diff", c.Path)
		}
		if c.Path == "work/big" && (!c.Binary || c.New == nil || c.New.Size != 3<<20 || c.Unified != "") {
			t.Errorf("big file: %+v", c)
		}
	}
}

// TestBenchSelfDiff measures the diff row (100 edited files of a 1 GiB
// workspace, through the API) and checks the report's shape: every sample
// an answer with the 100 edits (a wrong answer is a failed sample).
// Timings are never asserted.
func TestBenchSelfDiff(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	bin := testutil.BuildBinaries(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "berth"), "bench", "--self", "--runs", "2", "--warmup", "0",
		"--runtime", "runc", "--only", "diff", "--json", out)
	cmd.Env = append(os.Environ(), "BERTH_URL=http://127.0.0.1:1", "BERTH_API_KEY=unused")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("berth bench: %v\n%s", err, b)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("report is not a bench.Report: %v\n%s", err, raw)
	}
	if len(rep.Metrics) != 1 || rep.Metrics[0].Name != "diff" {
		t.Fatalf("want the diff row only, got %+v", rep.Metrics)
	}
	m := rep.Metrics[0]
	if !m.Available || len(m.Samples) != 2 || len(m.Errors) != 0 || !strings.Contains(m.Definition, "1 GiB") {
		t.Errorf("diff row: want 2 samples and no errors, got %+v", m)
	}
	t.Logf("diff of 100 edited files of a 1 GiB workspace (runc): %v ms", m.Samples)
}
