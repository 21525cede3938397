// Package runtimetest is the conformance suite every runtime.Runtime backend
// runs: real containers over a real overlay rootfs (rootfs.Prepare over a
// busybox lower), with real cgroup limits. Each test's PID 1 is a busybox
// shell script that reports through a bind-mounted host directory (/run/x).
package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
)

// hostDir is where each sandbox's host report directory is mounted.
const hostDir = "/run/x"

// Run runs the conformance suite against the backend newRuntime returns.
func Run(t *testing.T, newRuntime func(t *testing.T) runtime.Runtime) {
	RequireHost(t, "mkfs.ext4")
	e := newEnv(t, newRuntime(t))
	t.Run("Lifecycle", e.testLifecycle)
	t.Run("Isolation", e.testIsolation)
	t.Run("UnixSocket", e.testUnixSocket)
	t.Run("MemoryLimit", e.testMemoryLimit)
	t.Run("PidsLimit", e.testPidsLimit)
	t.Run("CPUQuota", e.testCPUQuota)
	t.Run("DiskLimit", e.testDiskLimit)
	t.Run("CheckpointRestore", e.testCheckpointRestore)
}

// RequireHost fails under CI=true (a suite must not pass having run
// nothing) and skips elsewhere when root or a tool is missing.
func RequireHost(t testing.TB, tools ...string) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("missing prerequisite(s) in CI: %s", strings.Join(missing, ", "))
	}
	t.Skipf("missing prerequisite(s): %s", strings.Join(missing, ", "))
}

type env struct {
	rt    runtime.Runtime
	base  string // short path: unix socket paths must fit in 108 bytes
	lower string

	helperOnce sync.Once
	helper     string
	helperErr  error
}

func newEnv(t *testing.T, rt runtime.Runtime) *env {
	base, err := os.MkdirTemp("", "brt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	lower := filepath.Join(base, "lower")
	if err := rootfs.BusyboxRootFS(lower); err != nil {
		t.Fatal(err)
	}
	return &env{rt: rt, base: base, lower: lower}
}

// box is one sandbox under test.
type box struct {
	id    string
	dir   string // sandbox dir (rootfs, bundle)
	host  string // host side of /run/x
	spec  runtime.Spec
	first int // first counter value seen (checkpoint test)
}

type boxOpts struct {
	script   string
	res      runtime.Resources
	diskMiB  int64
	hostname string
	mounts   []runtime.Mount
}

func newID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return "rt" + hex.EncodeToString(b)
}

// prepare makes the sandbox dir, rootfs and spec without starting anything.
func (e *env) prepare(t *testing.T, o boxOpts) *box {
	t.Helper()
	id := newID()
	dir := filepath.Join(e.base, id)
	host := filepath.Join(dir, "x")
	if err := os.MkdirAll(host, 0o777); err != nil {
		t.Fatal(err)
	}
	disk := o.diskMiB
	if disk == 0 {
		disk = 64
	}
	ctx := context.Background()
	root, err := rootfs.Prepare(ctx, filepath.Join(dir, "fs"), []string{e.lower}, disk, nil)
	t.Cleanup(func() {
		if err := rootfs.Teardown(context.Background(), filepath.Join(dir, "fs")); err != nil {
			t.Errorf("teardown rootfs of %s: %v", id, err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	res := o.res
	if res == (runtime.Resources{}) {
		res = runtime.Resources{CPUMillis: 1000, MemoryBytes: 256 << 20, Pids: 128}
	}
	b := &box{id: id, dir: dir, host: host, spec: runtime.Spec{
		ID:        id,
		BundleDir: dir,
		RootFS:    root,
		Hostname:  o.hostname,
		Args:      []string{"/bin/sh", "-c", o.script},
		Env:       []string{"HOME=/root"},
		Mounts:    append([]runtime.Mount{{Source: host, Target: hostDir}}, o.mounts...),
		Resources: res,
		LogPath:   filepath.Join(dir, "log"),
	}}
	return b
}

// start prepares and runs a sandbox; it is deleted when the test ends.
func (e *env) start(t *testing.T, o boxOpts) *box {
	t.Helper()
	b := e.prepare(t, o)
	e.run(t, b, func(ctx context.Context) error { return e.rt.Run(ctx, b.spec) })
	return b
}

// run starts b with startFn and registers its deletion.
func (e *env) run(t *testing.T, b *box, startFn func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.rt.Delete(ctx, b.id); err != nil {
			t.Errorf("delete %s: %v", b.id, err)
		}
	})
	if err := startFn(ctx); err != nil {
		t.Fatalf("start %s: %v\nlog: %s", b.id, err, b.log())
	}
}

func (b *box) log() string {
	data, _ := os.ReadFile(b.spec.LogPath)
	return tail(string(data), 2000)
}

// read returns the trimmed content of a report file, "" if absent.
func (b *box) read(name string) string {
	data, _ := os.ReadFile(filepath.Join(b.host, name))
	return strings.TrimSpace(string(data))
}

// waitFile waits until the sandbox has written name and returns it.
func (b *box) waitFile(t *testing.T, name string, timeout time.Duration) string {
	t.Helper()
	var got string
	waitFor(t, timeout, func() bool {
		got = b.read(name)
		return got != ""
	}, func() string { return "sandbox " + b.id + " never wrote " + name + "; log: " + b.log() })
	return got
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %s", timeout, msg())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// udsHelper builds the static udsecho binary once per suite.
func (e *env) udsHelper(t *testing.T) string {
	e.helperOnce.Do(func() {
		out := filepath.Join(e.base, "bin", "udsecho")
		cmd := exec.Command("go", "build", "-o", out, "github.com/berth-dev/berth/internal/runtime/runtimetest/udsecho")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			e.helperErr = &buildError{err: err, out: string(msg)}
			return
		}
		e.helper = out
	})
	if e.helperErr != nil {
		t.Fatal(e.helperErr)
	}
	return e.helper
}

type buildError struct {
	err error
	out string
}

func (b *buildError) Error() string { return "build udsecho: " + b.err.Error() + ": " + b.out }
