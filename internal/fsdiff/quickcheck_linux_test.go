package fsdiff

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestQuickCheck: with Options.QuickCheck an equal-size file is unchanged
// only when the from side's copy carries the to side's live stamp; every
// other case is modified, no content is read (no digests) — and without
// the option the same views give the exact answer.
func TestQuickCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("trusted.* xattrs need root (CI=true)")
		}
		t.Skip("trusted.* xattrs need root")
	}
	from, to := t.TempDir(), t.TempDir()
	write := func(dir, name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stamp := func(copyPath, origPath string) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(origPath, &st); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(copyPath, StampXattr, []byte(StatStamp(&st)), 0); err != nil {
			t.Fatal(err)
		}
	}
	// stamped: the copy records the original's stamp, untouched since.
	stamp(write(from, "stamped", "aaaa"), write(to, "stamped", "aaaa"))
	// rewritten: stamped, then the original rewritten with other bytes
	// of the same size (ctime moves).
	rw := write(to, "rewritten", "bbbb")
	stamp(write(from, "rewritten", "bbbb"), rw)
	write(to, "rewritten", "cccc")
	// forged: the stamp of another file (inode differs).
	stamp(write(from, "forged", "dddd"), filepath.Join(to, "stamped"))
	write(to, "forged", "eeee")
	// nostamp: same bytes, no stamp: QuickCheck calls it modified.
	write(from, "nostamp", "ffff")
	write(to, "nostamp", "ffff")
	// resized: sizes differ.
	write(from, "resized", "g")
	write(to, "resized", "gggg")
	// badstamp: garbage in the xattr.
	write(to, "badstamp", "hhhh")
	bs := write(from, "badstamp", "hhhh")
	if err := unix.Setxattr(bs, StampXattr, []byte("not a stamp"), 0); err != nil {
		t.Fatal(err)
	}

	diff := func(o Options) map[string]Change {
		t.Helper()
		fl, err := OpenDirLayer(from, "from", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer fl.Close()
		tl, err := OpenDirLayer(to, "to", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tl.Close()
		res, err := Diff(context.Background(), NewTree(fl), NewTree(tl), o)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]Change{}
		for _, c := range res.Changes {
			out[c.Path] = c
		}
		return out
	}
	quick := diff(Options{DigestsOnly: true, NoText: true, QuickCheck: true})
	for _, tc := range []struct {
		path    string
		changed bool
	}{
		{"stamped", false},
		{"rewritten", true},
		{"forged", true},
		{"nostamp", true}, // over-reported: costs a copy, never a wrong view
		{"resized", true},
		{"badstamp", true},
	} {
		c, ok := quick[tc.path]
		if ok != tc.changed {
			t.Errorf("QuickCheck: %s changed = %v, want %v", tc.path, ok, tc.changed)
		}
		if ok && (c.New.SHA256 != "" || c.Old.SHA256 != "") {
			t.Errorf("QuickCheck: %s has digests %q/%q: content was read", tc.path, c.Old.SHA256, c.New.SHA256)
		}
	}
	exact := diff(Options{DigestsOnly: true, NoText: true})
	for _, p := range []string{"rewritten", "forged", "resized"} {
		if c, ok := exact[p]; !ok || !c.ContentChanged || c.New.SHA256 == "" {
			t.Errorf("exact: %s = %+v, %v; want a content change with a digest", p, c, ok)
		}
	}
	for _, p := range []string{"stamped", "nostamp", "badstamp"} {
		if _, ok := exact[p]; ok {
			t.Errorf("exact: %s reported changed; its bytes are the same", p)
		}
	}
}

// TestQuickCheckNeverFollowsSymlinks: a stamped name that is a symlink on
// the to side is compared as a symlink (type change), never opened.
func TestQuickCheckNeverFollowsSymlinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("trusted.* xattrs need root")
	}
	from, to, outside := t.TempDir(), t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("xxxx"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(from, "f")
	if err := os.WriteFile(cp, []byte("xxxx"), 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(secret, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(cp, StampXattr, []byte(StatStamp(&st)), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(to, "f")); err != nil {
		t.Fatal(err)
	}
	fl, _ := OpenDirLayer(from, "from", nil)
	defer fl.Close()
	tl, _ := OpenDirLayer(to, "to", nil)
	defer tl.Close()
	res, err := Diff(context.Background(), NewTree(fl), NewTree(tl), Options{DigestsOnly: true, NoText: true, QuickCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 1 || !res.Changes[0].TypeChanged || res.Changes[0].New.Type != TypeSymlink {
		t.Fatalf("changes = %+v, want f a file replaced by a symlink", res.Changes)
	}
}
