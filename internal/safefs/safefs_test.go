package safefs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// tree is a root with a canary outside it that every attack aims at.
type tree struct {
	root, canary string
}

const canaryText = "host canary\n"

func newTree(t *testing.T) tree {
	t.Helper()
	base := t.TempDir()
	tr := tree{root: filepath.Join(base, "root"), canary: filepath.Join(base, "canary")}
	for _, d := range []string{"etc/ssl", "real"} {
		if err := os.MkdirAll(filepath.Join(tr.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(tr.canary, []byte(canaryText), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tr.root, "etc/ssl/bundle.pem"), []byte("bundle\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return tr
}

func (tr tree) plant(t *testing.T, rel, target string) {
	t.Helper()
	p := filepath.Join(tr.root, rel)
	_ = os.RemoveAll(p)
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func (tr tree) canaryIntact(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(tr.canary)
	if err != nil || string(b) != canaryText {
		t.Fatalf("canary changed: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(tr.canary), "x")); err == nil {
		t.Fatalf("a file appeared next to the canary")
	}
}

func wantRefused(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("want ErrRefused, got %v", err)
	}
	if !errs.Is(err, errs.PermissionDenied) {
		t.Fatalf("want kind PermissionDenied, got %v (%v)", errs.KindOf(err), err)
	}
}

// attacks are the symlinks a sandbox plants: every one must be refused by
// every operation, and the canary must stay as it was.
func attacks(tr tree) []struct{ name, plantAt, target, open string } {
	return []struct{ name, plantAt, target, open string }{
		{"absolute final", "etc/machine-id", tr.canary, "etc/machine-id"},
		{"relative final", "etc/machine-id", "../../canary", "etc/machine-id"},
		{"relative inside root", "etc/machine-id", "ssl/bundle.pem", "etc/machine-id"},
		{"absolute intermediate", "etc/ssl", filepath.Dir(tr.canary), "etc/ssl/canary"},
		{"relative intermediate", "etc/ssl", "../..", "etc/ssl/canary"},
		{"intermediate inside root", "etc/ssl", "../real", "etc/ssl/bundle.pem"},
		{"leading slash path", "etc/machine-id", tr.canary, "/etc/machine-id"},
	}
}

func TestSymlinksRefused(t *testing.T) {
	ops := map[string]func(root, name string) error{
		"Open": func(root, name string) error {
			f, err := Open(root, name)
			if err == nil {
				f.Close()
			}
			return err
		},
		"OpenFile rdwr": func(root, name string) error {
			f, err := OpenFile(root, name, os.O_RDWR|os.O_APPEND, 0)
			if err == nil {
				_, _ = f.WriteString("x")
				f.Close()
			}
			return err
		},
		"OpenFile create trunc": func(root, name string) error {
			f, err := OpenFile(root, name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
			if err == nil {
				_, _ = f.WriteString("x")
				f.Close()
			}
			return err
		},
		"ReadFile": func(root, name string) error { _, err := ReadFile(root, name, 1<<20); return err },
	}
	for opName, op := range ops {
		for _, a := range attacks(newTree(t)) {
			t.Run(opName+"/"+a.name, func(t *testing.T) {
				tr := newTree(t)
				tr.plant(t, a.plantAt, a.target)
				wantRefused(t, op(tr.root, a.open))
				tr.canaryIntact(t)
			})
		}
	}
}

func TestWriteFileReplacesSymlinkAndRefusesIntermediate(t *testing.T) {
	tr := newTree(t)
	tr.plant(t, "etc/machine-id", tr.canary)
	if err := WriteFile(tr.root, "/etc/machine-id", []byte("fresh\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	tr.canaryIntact(t)
	p := filepath.Join(tr.root, "etc/machine-id")
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o444 {
		t.Fatalf("want a regular 0444 file, got %v, %v", fi, err)
	}
	if b, _ := os.ReadFile(p); string(b) != "fresh\n" {
		t.Fatalf("content %q", b)
	}

	for _, target := range []string{filepath.Dir(tr.canary), "../.."} {
		tr.plant(t, "etc/ssl", target)
		wantRefused(t, WriteFile(tr.root, "etc/ssl/x", []byte("evil"), 0o644))
		tr.canaryIntact(t)
	}
	if err := WriteFile(tr.root, "../x", []byte("evil"), 0o644); !errors.Is(err, ErrRefused) {
		t.Fatalf("..: want ErrRefused, got %v", err)
	}
	tr.canaryIntact(t)
}

func TestSpecialFilesRefusedWithoutOpening(t *testing.T) {
	tr := newTree(t)
	fifo := filepath.Join(tr.root, "etc/fifo")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	// Opening a FIFO with no writer blocks; a refused open returns at once.
	done := make(chan error, 1)
	go func() { _, err := ReadFile(tr.root, "etc/fifo", 100); done <- err }()
	select {
	case err := <-done:
		wantRefused(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("ReadFile of a FIFO blocked: it opened the FIFO")
	}
	go func() {
		f, err := OpenFile(tr.root, "etc/fifo", os.O_WRONLY|os.O_CREATE, 0o644)
		if err == nil {
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		wantRefused(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("OpenFile of a FIFO blocked: it opened the FIFO")
	}

	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("device node cases need root")
		}
		t.Skip("device node cases need root")
	}
	// /dev/null's numbers: opening it would succeed, so only the type check
	// can refuse it.
	dev := filepath.Join(tr.root, "etc/null")
	if err := unix.Mknod(dev, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	for _, op := range []func() error{
		func() error { _, err := ReadFile(tr.root, "etc/null", 100); return err },
		func() error { _, err := OpenFile(tr.root, "etc/null", os.O_RDWR, 0); return err },
		func() error {
			_, err := OpenFile(tr.root, "etc/null", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
			return err
		},
	} {
		wantRefused(t, op())
	}
	// A block device too (loop0's numbers).
	blk := filepath.Join(tr.root, "etc/blk")
	if err := unix.Mknod(blk, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))); err != nil {
		t.Fatal(err)
	}
	_, err := ReadFile(tr.root, "etc/blk", 100)
	wantRefused(t, err)
	// WriteFile replaces a device node instead of writing into it.
	if err := WriteFile(tr.root, "etc/null", []byte("plain\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(dev); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("device node not replaced by a regular file: %v, %v", fi, err)
	}
}

func TestRegularFiles(t *testing.T) {
	tr := newTree(t)
	b, err := ReadFile(tr.root, "/etc/ssl/bundle.pem", 1<<20)
	if err != nil || string(b) != "bundle\n" {
		t.Fatalf("ReadFile: %q, %v", b, err)
	}
	if _, err := ReadFile(tr.root, "etc/ssl/bundle.pem", 3); !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("oversized ReadFile: want ResourceExhausted, got %v", err)
	}
	f, err := OpenFile(tr.root, "etc/ssl/bundle.pem", os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("more\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if b, _ := os.ReadFile(filepath.Join(tr.root, "etc/ssl/bundle.pem")); string(b) != "bundle\nmore\n" {
		t.Fatalf("append: %q", b)
	}
	f, err = OpenFile(tr.root, "etc/new", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := OpenFile(tr.root, "etc/new", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); !errs.Is(err, errs.AlreadyExists) {
		t.Fatalf("O_EXCL on an existing file: want AlreadyExists, got %v", err)
	}
	if _, err := Open(tr.root, "etc/missing"); !errs.Is(err, errs.NotFound) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing: want NotFound wrapping ErrNotExist, got %v", err)
	}
	if _, err := Open(tr.root, "etc"); !errors.Is(err, ErrRefused) {
		t.Fatalf("a directory: want ErrRefused, got %v", err)
	}
	d, err := (func() (*os.File, error) {
		r, err := OpenRoot(tr.root)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return r.OpenDir("etc/ssl")
	})()
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}
