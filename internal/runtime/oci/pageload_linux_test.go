package oci

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
)

// memBox is one container of testdata/memcheck over a rootfs of its own;
// memcheck talks through x, a host directory bound at /x (gVisor keeps
// /tmp in a tmpfs of its own).
type memBox struct {
	spec runtime.Spec
	x    string
}

// lazyEnv builds memcheck once and makes containers of it.
type lazyEnv struct {
	o    *OCI
	base string
	bin  string
	mib  int
}

func newLazyEnv(t *testing.T, mib int) *lazyEnv {
	t.Helper()
	o := newBackend(t, Runsc)
	if d := os.Getenv("BERTH_RUNSC_DEBUG_LOG"); d != "" {
		o.cfg.RunscFlags = append(o.cfg.RunscFlags, "--debug", "--debug-log="+d+"/")
	}
	base := t.TempDir()
	bin := filepath.Join(base, "memcheck")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/memcheck")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build memcheck: %v: %s", err, out)
	}
	return &lazyEnv{o: o, base: base, bin: bin, mib: mib}
}

// box prepares (does not start) container id: the same rootfs content and
// spec for every id, as a restore of one image needs.
func (e *lazyEnv) box(t *testing.T, id string) *memBox {
	t.Helper()
	dir := filepath.Join(e.base, id)
	root := filepath.Join(dir, "rootfs")
	if err := rootfs.BusyboxRootFS(root); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", e.bin, filepath.Join(root, "memcheck")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	x := filepath.Join(dir, "x")
	if err := os.MkdirAll(x, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Logf("log of %s:\n%s", id, tail(string(b), 4000))
		}
		_ = e.o.Delete(context.Background(), id)
	})
	return &memBox{x: x, spec: runtime.Spec{ID: id, BundleDir: dir, RootFS: root, Hostname: "memcheck",
		Args:      []string{"/memcheck", strconv.Itoa(e.mib)},
		Mounts:    []runtime.Mount{{Source: x, Target: "/x"}},
		Resources: runtime.Resources{MemoryBytes: int64(e.mib+512) << 20},
		LogPath:   filepath.Join(dir, "log")}}
}

func waitFile(t *testing.T, path string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(path); err == nil {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within %s", path, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// check asks b's memcheck to verify its whole buffer and returns its answer.
func (b *memBox) check(t *testing.T) string {
	t.Helper()
	res := filepath.Join(b.x, "result")
	_ = os.Remove(res)
	if err := os.WriteFile(filepath.Join(b.x, "check"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(waitFile(t, res, 2*time.Minute))
}

// checkpointed starts a memcheck container, waits until its buffer is
// filled, and checkpoints it: the image's path.
func (e *lazyEnv) checkpointed(t *testing.T, ctx context.Context) string {
	t.Helper()
	src := e.box(t, fmt.Sprintf("lzs%d", time.Now().UnixNano()%1e9))
	if err := e.o.Run(ctx, src.spec); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(src.x, "ready"), 30*time.Second)
	if got := src.check(t); got != fmt.Sprintf("ok %d", e.mib) {
		t.Fatalf("before the checkpoint: %q", got)
	}
	img := filepath.Join(e.base, "image")
	t0 := time.Now()
	if err := e.o.Checkpoint(ctx, src.spec.ID, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	t.Logf("checkpoint of %d MiB: %v", e.mib, time.Since(t0))
	if err := e.o.Delete(ctx, src.spec.ID); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestRunscLazyRestoreKeepsMemory: a runsc restore returns before the
// memory image is read (the pages load in the background), and the
// process's whole buffer is intact — checked at once, while pages still
// load, and again after — in each of two restores of one image running
// side by side (a fork). The image counts as read until every load ended.
func TestRunscLazyRestoreKeepsMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := newLazyEnv(t, lazyMiB())
	img := e.checkpointed(t, ctx)
	want := fmt.Sprintf("ok %d", e.mib)
	kids := []*memBox{e.box(t, "lzk1"), e.box(t, "lzk2")}
	var wg sync.WaitGroup
	for i, k := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			if err := e.o.Restore(ctx, k.spec, img); err != nil {
				t.Errorf("restore %s: %v", k.spec.ID, err)
				return
			}
			t.Logf("restore #%d returned after %v with %d load(s) of the image going on", i+1, time.Since(t0), e.o.ImageReaders(img))
			if got := k.check(t); got != want {
				t.Errorf("%s right after restore: %q, want %q", k.spec.ID, got, want)
			}
			t.Logf("restore #%d: first full check done after %v", i+1, time.Since(t0))
			if err := e.o.WaitPagesLoaded(ctx, k.spec.ID); err != nil {
				t.Errorf("%s: pages loaded: %v", k.spec.ID, err)
			}
			t.Logf("restore #%d: pages loaded after %v", i+1, time.Since(t0))
			if got := k.check(t); got != want {
				t.Errorf("%s after the load: %q, want %q", k.spec.ID, got, want)
			}
		}()
	}
	wg.Wait()
	if n := e.o.ImageReaders(img); n != 0 {
		t.Errorf("%d loads of the image still counted after every WaitPagesLoaded returned", n)
	}
	for _, k := range kids {
		if st, err := e.o.State(ctx, k.spec.ID); err != nil || st.State != "running" {
			t.Errorf("%s: %+v %v, want running", k.spec.ID, st, err)
		}
	}
}

// TestRunscDeleteDuringPageLoad: deleting a container whose pages still
// load ends the load and its watch, and leaves no process, no mount and
// nothing holding the image.
func TestRunscDeleteDuringPageLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := newLazyEnv(t, lazyMiB())
	img := e.checkpointed(t, ctx)
	k := e.box(t, fmt.Sprintf("lzd%d", time.Now().UnixNano()%1e9))
	if err := e.o.Restore(ctx, k.spec, img); err != nil {
		t.Fatal(err)
	}
	if n := e.o.ImageReaders(img); n != 1 {
		t.Fatalf("image readers right after restore: %d, want 1 (the load was over before the delete could test anything)", n)
	}
	if err := e.o.Delete(ctx, k.spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.o.WaitPagesLoaded(ctx, k.spec.ID); err != nil {
		t.Errorf("WaitPagesLoaded after Delete: %v, want nil (no load going on)", err)
	}
	if n := e.o.ImageReaders(img); n != 0 {
		t.Errorf("image readers after Delete: %d", n)
	}
	if _, err := e.o.State(ctx, k.spec.ID); !errs.Is(err, errs.NotFound) {
		t.Errorf("State after Delete: %v, want not_found", err)
	}
	// Nothing of the container is left: no process names it (runsc's
	// sandbox, gofer, `runsc wait`), no process holds the image open, no
	// mount is under its bundle.
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := processesMentioning(t, k.spec.ID, img)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind after Delete: %s", strings.Join(left, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), k.spec.BundleDir) {
		t.Errorf("a mount under %s is left after Delete", k.spec.BundleDir)
	}
	if err := os.RemoveAll(img); err != nil {
		t.Errorf("remove the image: %v", err)
	}
}

// TestRunscFailedPageLoad: an image that turns unreadable while its pages
// load (truncated here, after `runsc restore` returned) fails the load:
// WaitPagesLoaded says so, with the runtime's reason, and the container's
// processes are gone — nothing runs on half a memory.
func TestRunscFailedPageLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := newLazyEnv(t, lazyMiB())
	img := e.checkpointed(t, ctx)
	k := e.box(t, fmt.Sprintf("lzf%d", time.Now().UnixNano()%1e9))
	if err := e.o.Restore(ctx, k.spec, img); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(img, "pages.img"), 4096); err != nil {
		t.Fatal(err)
	}
	if n := e.o.ImageReaders(img); n != 1 {
		t.Fatalf("image readers after the truncation: %d, want 1 (the load was over before the image was cut)", n)
	}
	err := e.o.WaitPagesLoaded(ctx, k.spec.ID)
	if err == nil || errs.Is(err, errs.NotFound) {
		t.Fatalf("WaitPagesLoaded of a truncated image: %v, want a load failure", err)
	}
	t.Logf("load failure: %v", err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := e.o.State(ctx, k.spec.ID)
		if errs.Is(err, errs.NotFound) || (err == nil && st.State == "stopped") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container after a failed load: %+v %v, want stopped", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// processesMentioning lists processes whose command line names one of
// words or that hold a file under one of them open.
func processesMentioning(t *testing.T, words ...string) []string {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cl, _ := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		cmd := strings.ReplaceAll(string(cl), "\x00", " ")
		for _, w := range words {
			if strings.Contains(cmd, w) {
				out = append(out, fmt.Sprintf("pid %d: %s", pid, cmd))
			}
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", ent.Name(), "fd"))
		for _, fd := range fds {
			target, _ := os.Readlink(filepath.Join("/proc", ent.Name(), "fd", fd.Name()))
			for _, w := range words {
				if strings.HasPrefix(target, w+"/") {
					out = append(out, fmt.Sprintf("pid %d holds %s (%s)", pid, target, cmd))
				}
			}
		}
	}
	return out
}

// lazyMiB is the size of memcheck's buffer: 1 GiB, or $BERTH_LAZY_MIB
// (below 256 the image is restored whole and the load tests fail).
func lazyMiB() int {
	if n, err := strconv.Atoi(os.Getenv("BERTH_LAZY_MIB")); err == nil && n > 0 {
		return n
	}
	return 1024
}

// TestLazyRestoreThreshold: only an image with a pages file of at least
// lazyRestoreMinBytes is restored lazily.
func TestLazyRestoreThreshold(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int64 // -1: no pages file
		want bool
	}{
		{"no pages file", -1, false},
		{"small", 2 << 20, false},
		{"just below", lazyRestoreMinBytes - 1, false},
		{"at the threshold", lazyRestoreMinBytes, true},
		{"1 GiB", 1 << 30, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.size >= 0 {
				if err := os.WriteFile(filepath.Join(dir, "pages.img"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(filepath.Join(dir, "pages.img"), tc.size); err != nil { // sparse
					t.Fatal(err)
				}
			}
			if got := lazyRestore(dir); got != tc.want {
				t.Errorf("lazyRestore with pages.img of %d bytes = %v, want %v", tc.size, got, tc.want)
			}
		})
	}
}
