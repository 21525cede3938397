package merge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
)

// snapshotDir describes every entry under root: type, mode, content or
// symlink target.
func snapshotDir(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%v", fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			desc += " " + string(b)
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mkTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := filepath.Join(root, k)
		v := files[k]
		var err error
		switch {
		case strings.HasSuffix(k, "/"):
			err = os.MkdirAll(p, 0o755)
		case v == "WHITEOUT":
			err = mknodWhiteout(p)
		case strings.HasPrefix(v, "->"):
			err = os.Symlink(strings.TrimPrefix(v, "->"), p)
		default:
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.WriteFile(p, []byte(v), 0o644)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

type applyFixture struct {
	target string
	in     Inputs
	src    Sources
}

// newApplyFixture: a base tree, a target that started as a copy of it and
// changed its own lines, and a child upper over the base.
func newApplyFixture(t *testing.T) applyFixture {
	root := t.TempDir()
	base, target, child := filepath.Join(root, "base"), filepath.Join(root, "target"), filepath.Join(root, "child")
	common := map[string]string{"etc/": "", "etc/conf": text, "run.sh": "#!/bin/sh\n", "d/": "", "d/x": "x\n", "d/y": "y\n", "gone": "bye\n", "f": "file\n"}
	mkTree(t, base, common)
	mkTree(t, target, common)
	if err := os.WriteFile(filepath.Join(target, "etc/conf"), []byte("OURS\n"+text[3:]), 0o644); err != nil {
		t.Fatal(err)
	}
	mkTree(t, child, map[string]string{
		"etc/": "", "etc/conf": text[:len(text)-3] + "THEIRS\n",
		"new/": "", "new/deep/": "", "new/deep/file": "deep\n",
		"gone": "WHITEOUT", "d": "WHITEOUT",
		"ln": "->/etc/shadow",
		"f/": "", "f/inner": "inner\n",
	})
	if err := os.Chmod(filepath.Join(child, "run.sh"), 0o755); err == nil {
		t.Fatal("run.sh should not exist in the child upper yet")
	}
	if err := os.WriteFile(filepath.Join(child, "run.sh"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(child, "run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	open := func(dir, id string) *fsdiff.DirLayer {
		l, err := fsdiff.OpenDirLayer(dir, id, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	b, tg, c := open(base, "base"), open(target, "target"), open(child, "child")
	in := Inputs{Base: fsdiff.NewTree(b), Ours: fsdiff.NewTree(tg), Theirs: fsdiff.NewTree(c, b)}
	return applyFixture{target: target, in: in, src: Sources{SideBase: in.Base, SideTheirs: in.Theirs}}
}

func TestApply(t *testing.T) {
	f := newApplyFixture(t)
	before := snapshotDir(t, f.target)
	p, err := Compute(context.Background(), f.in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Clean() {
		t.Fatalf("conflicts: %v", conflicts(p))
	}
	var saved []string
	err = Apply(context.Background(), f.target, p, f.src, "m1", ApplyOptions{
		Save:         func(j *Journal) error { saved = append(saved, j.State); return nil },
		BeforeCommit: func() error { return Verify(p, fsdiff.NewTree(f.in.Ours.Layers()...)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{JournalPrepared, JournalCommitting, JournalCommitted}, saved); d != "" {
		t.Errorf("journal states (-want +got):\n%s", d)
	}
	want := map[string]string{}
	for k, v := range before {
		want[k] = v
	}
	delete(want, "gone")
	delete(want, "d")
	delete(want, "d/x")
	delete(want, "d/y")
	delete(want, "f")
	want["etc/conf"] = "-rw-r--r-- OURS\n" + text[3:len(text)-3] + "THEIRS\n"
	want["run.sh"] = "-rwxr-xr-x #!/bin/sh\n"
	want["new"] = "drwxr-xr-x"
	want["new/deep"] = "drwxr-xr-x"
	want["new/deep/file"] = "-rw-r--r-- deep\n"
	want["ln"] = "Lrwxrwxrwx -> /etc/shadow"
	want["f"] = "drwxr-xr-x"
	want["f/inner"] = "-rw-r--r-- inner\n"
	if d := cmp.Diff(want, snapshotDir(t, f.target)); d != "" {
		t.Errorf("target after apply (-want +got):\n%s", d)
	}
}

// An apply killed after any number of renames is rolled back by Recover
// from its journal: the target is exactly as before.
func TestApplyInterruptedRollsBack(t *testing.T) {
	f := newApplyFixture(t)
	p, err := Compute(context.Background(), f.in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	steps := len(p.Deletes) + len(p.Writes)
	if steps < 8 {
		t.Fatalf("plan has %d steps; the fixture should exercise more", steps)
	}
	for k := 1; k < steps; k++ {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			f := newApplyFixture(t)
			before := snapshotDir(t, f.target)
			p, err := Compute(context.Background(), f.in, Options{})
			if err != nil {
				t.Fatal(err)
			}
			var stored []byte
			save := func(j *Journal) error { stored, err = json.Marshal(j); return err }
			err = Apply(context.Background(), f.target, p, f.src, "m2", ApplyOptions{Save: save, crashAfter: k})
			if !errors.Is(err, errCrash) {
				t.Fatalf("apply: %v, want the simulated crash", err)
			}
			var j Journal // as the restarted daemon reads it back
			if err := json.Unmarshal(stored, &j); err != nil {
				t.Fatal(err)
			}
			if j.State != JournalCommitting {
				t.Fatalf("journal state %q", j.State)
			}
			if err := Recover(f.target, &j); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(before, snapshotDir(t, f.target)); d != "" {
				t.Errorf("target after recovery (-want +got):\n%s", d)
			}
		})
	}
}

func TestApplyRefusals(t *testing.T) {
	f := newApplyFixture(t)
	before := snapshotDir(t, f.target)
	p, err := Compute(context.Background(), f.in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	save := func(*Journal) error { return nil }
	// The target moved on after planning: Verify (under the freeze) says so,
	// and nothing is applied.
	if err := os.WriteFile(filepath.Join(f.target, "gone"), []byte("edited meanwhile\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before["gone"] = "-rw-r--r-- edited meanwhile\n"
	err = Apply(context.Background(), f.target, p, f.src, "m3", ApplyOptions{Save: save,
		BeforeCommit: func() error { return Verify(p, fsdiff.NewTree(f.in.Ours.Layers()...)) }})
	if !errs.Is(err, errs.Conflict) {
		t.Fatalf("apply over a changed target: %v, want Conflict", err)
	}
	if d := cmp.Diff(before, snapshotDir(t, f.target)); d != "" {
		t.Errorf("target after a refused apply (-want +got):\n%s", d)
	}
	// A plan with conflicts is never applied.
	p.Conflicts = []Conflict{{ID: "cx", Path: "x"}}
	if err := Apply(context.Background(), f.target, p, f.src, "m4", ApplyOptions{Save: save}); !errs.Is(err, errs.FailedPrecondition) {
		t.Fatalf("apply with conflicts: %v", err)
	}
}
