package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// startupBound is how many times a trivial Go program's start-up `berth
// help` may cost (minimum CPU time of 40 runs each). The berth binary is the
// server too, and Go runs every linked package's initialisers before main:
// a CLI call pays for them. Measured on a 2-core VM (CGO_ENABLED=0):
// 3.1× after the lazy patterns and berth's own OTLP exporter, 4.8× with the
// lazy patterns alone (gRPC linked), 5.3× before either.
// The bound is a ratio to a program measured in the same run, not a
// figure in ms, so a slow or busy machine moves both sides.
const startupBound = 4.5

// TestStartupOverhead fails when the CLI's start-up regresses: a server
// package that compiles, parses or allocates at init time instead of on
// first use (sync.OnceValue, internal/lazyregexp) shows up here.
func TestStartupOverhead(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the berth binary")
	}
	dir := t.TempDir()
	berth := build(t, dir, "berth", ".")
	trivial := build(t, dir, "trivial", "./testdata/startupbaseline")

	// Interleaved, so that whatever else the machine does falls on both;
	// CPU time (user+sys of the child) rather than wall time, so that
	// waiting for a core does not count; the minimum of each, as load only
	// ever adds to a sample (the medians are logged).
	const rounds = 40
	var cb, ct, wb, wt []float64
	for i := 0; i < rounds+3; i++ {
		c1, w1 := run(t, trivial)
		c2, w2 := run(t, berth, "help")
		if i < 3 { // the first runs fault the binaries into the page cache
			continue
		}
		ct, wt = append(ct, c1), append(wt, w1)
		cb, wb = append(cb, c2), append(wb, w2)
	}
	mb, mt := slices.Min(cb), slices.Min(ct)
	t.Logf("berth help: CPU min %.2f p50 %.2f ms, wall p50 %.2f ms; trivial Go program: CPU min %.2f p50 %.2f ms, wall p50 %.2f ms; min ratio %.2f (bound %.1f)",
		mb, median(cb), median(wb), mt, median(ct), median(wt), mb/mt, startupBound)
	if mb > startupBound*mt {
		t.Errorf("berth help costs %.2f ms of CPU, %.1f× a trivial Go program's %.2f ms (bound %.1f×): something runs at init time that should wait for its first use (GODEBUG=inittrace=1 berth help shows which package)",
			mb, mb/mt, mt, startupBound)
	}
}

// build compiles pkg and copies the result: a file the linker has just
// written through mmap sits in the page cache in small pages and starts
// ~2 ms slower than the same bytes written by a copy (an installed binary).
func build(t *testing.T, dir, name, pkg string) string {
	t.Helper()
	tmp := filepath.Join(dir, name+".link")
	cmd := exec.Command("go", "build", "-o", tmp, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as the Makefile and setup.sh build it
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	out := filepath.Join(dir, name)
	src, err := os.Open(tmp)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

func run(t *testing.T, bin string, args ...string) (cpuMS, wallMS float64) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	}
	wall := time.Since(start)
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return float64(cpu.Microseconds()) / 1000, float64(wall.Microseconds()) / 1000
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestNoTestingInBinary fails when a non-test file of a package the berth
// binary links imports testing or a test library (the store's conformance
// suite once did: internal/store/storetest is imported by tests only).
func TestNoTestingInBinary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v: %s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "testing" || strings.HasPrefix(p, "github.com/google/go-cmp/") || strings.HasPrefix(p, "go.uber.org/goleak") || strings.HasSuffix(p, "/storetest") {
			t.Errorf("the berth binary links %s", p)
		}
	}
}
