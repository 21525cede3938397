// Package testutil holds helpers shared by berth's tests: build the real
// binaries once per test process, and require prerequisites — a missing
// prerequisite fails the test under CI=true and skips it otherwise, so the
// CI suite can never pass having run nothing.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// CI reports whether the tests run in CI (env CI=true).
func CI() bool { return os.Getenv("CI") == "true" }

// Missing fails the test in CI and skips it elsewhere.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("prerequisite missing (CI=true): "+format, args...)
	}
	t.Skipf("prerequisite missing: "+format, args...)
}

// RequireRoot needs euid 0.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "test needs root")
	}
}

// RequireTool needs an executable on PATH and returns its path.
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "tool %q not on PATH", name)
	}
	return p
}

// RepoRoot is the module root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func repoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", os.ErrNotExist
	}
	dir := filepath.Dir(file)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}

var build struct {
	once sync.Once
	dir  string
	err  error
	out  []byte
}

// BuildBinaries builds ./cmd/berth-agent (static, CGO_ENABLED=0) and
// ./cmd/berth (if present) once per test process and returns the directory
// holding them. The directory outlives single tests on purpose (os.MkdirTemp,
// not t.TempDir); it lives in the OS temp dir until RemoveBinaries, which
// the package's TestMain calls after the last test.
func BuildBinaries(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		root, err := repoRoot()
		if err != nil {
			build.err = err
			return
		}
		dir, err := os.MkdirTemp("", "berth-bin-")
		if err != nil {
			build.err = err
			return
		}
		build.dir = dir
		for _, pkg := range []string{"berth-agent", "berth"} {
			if _, err := os.Stat(filepath.Join(root, "cmd", pkg)); err != nil {
				continue
			}
			cmd := exec.Command("go", "build", "-o", filepath.Join(dir, pkg), "./cmd/"+pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				build.err, build.out = err, out
				return
			}
		}
	})
	if build.err != nil {
		t.Fatalf("build binaries: %v\n%s", build.err, build.out)
	}
	return build.dir
}

// programs are the test programs BuildProgram built, by package, and the
// directories ProcessDir made; RemoveBinaries removes them.
var programs struct {
	mu    sync.Mutex
	built map[string]*program
	dirs  []string
}

type program struct {
	once sync.Once
	path string
	err  error
}

// BuildProgram builds the Go package pkg (a path from the repository's
// root, e.g. "./test/e2e/testdata/fakeagent") as a static binary once per
// test process and returns its path: a program the tests copy into a
// sandbox. It lives until RemoveBinaries, like BuildBinaries' binaries.
func BuildProgram(t testing.TB, pkg string) string {
	t.Helper()
	programs.mu.Lock()
	if programs.built == nil {
		programs.built = map[string]*program{}
	}
	p := programs.built[pkg]
	if p == nil {
		p = &program{}
		programs.built[pkg] = p
	}
	programs.mu.Unlock()
	p.once.Do(func() {
		root, err := repoRoot()
		if err != nil {
			p.err = err
			return
		}
		dir, err := ProcessDir("berth-prog-")
		if err != nil {
			p.err = err
			return
		}
		p.path = filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-o", p.path, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			p.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if p.err != nil {
		t.Fatal(p.err)
	}
	return p.path
}

// ProcessDir makes a directory in the OS temp dir that outlives single
// tests (a fixture built once per process) and is removed by
// RemoveBinaries.
func ProcessDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	programs.mu.Lock()
	programs.dirs = append(programs.dirs, dir)
	programs.mu.Unlock()
	return dir, nil
}

// RemoveBinaries deletes what BuildBinaries and BuildProgram built and the
// directories of ProcessDir (call it from TestMain after m.Run): without it
// every test process left ~50 MB in the temp dir.
func RemoveBinaries() {
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
	programs.mu.Lock()
	defer programs.mu.Unlock()
	for _, d := range programs.dirs {
		_ = os.RemoveAll(d)
	}
	programs.dirs = nil
}
