// Package runtimetest is the conformance suite every runtime.Runtime backend
// runs. It has two parts:
//
//   - the contract (RunContract, contract.go): what the interface promises
//     that needs no kernel — states and their transitions, List, Stats,
//     errors of missing containers, failed starts that leave nothing,
//     checkpoint/restore as forks that are independent of each other, and
//     an honest refusal where a backend cannot checkpoint. It asserts only
//     through the interface, so an in-process backend (internal/runtime/fake)
//     runs it as an ordinary test without root.
//   - the kernel part (Run runs both): real containers over a real overlay
//     rootfs (rootfs.Prepare over a busybox lower), with real cgroup limits.
//     Each test's PID 1 is a busybox shell script that reports through a
//     bind-mounted host directory (/run/x): isolation, limits, the agent
//     channel's unix socket, and memory that survives a checkpoint.
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
	"github.com/berth-dev/berth/internal/testutil"
)

// hostDir is where each sandbox's host report directory is mounted.
const hostDir = "/run/x"

// Run runs the whole conformance suite (contract and kernel parts) against
// the backend newRuntime returns; it needs root and a kernel.
func Run(t *testing.T, newRuntime func(t *testing.T) runtime.Runtime) {
	RequireHost(t, "mkfs.ext4")
	e := newEnv(t, newRuntime(t), true)
	e.contract(t)
	t.Run("PID1", e.testPID1)
	t.Run("Isolation", e.testIsolation)
	t.Run("UnixSocket", e.testUnixSocket)
	t.Run("MemoryLimit", e.testMemoryLimit)
	t.Run("PidsLimit", e.testPidsLimit)
	t.Run("CPUQuota", e.testCPUQuota)
	t.Run("DiskLimit", e.testDiskLimit)
	t.Run("CheckpointRestore", e.testCheckpointRestore)
}

// RunContract runs the part of the suite that needs no kernel: every
// sandbox's root filesystem is a plain directory and nothing is asserted
// about what runs inside. Real backends run it as part of Run.
func RunContract(t *testing.T, newRuntime func(t *testing.T) runtime.Runtime) {
	e := newEnv(t, newRuntime(t), false)
	e.contract(t)
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
	rt     runtime.Runtime
	kernel bool   // root filesystems are overlays (rootfs.Prepare), not plain directories
	base   string // short path: unix socket paths must fit in 108 bytes
	lower  string

	helperOnce sync.Once
	helper     string
	helperErr  error
}

func newEnv(t *testing.T, rt runtime.Runtime, kernel bool) *env {
	base, err := os.MkdirTemp("", "brt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	e := &env{rt: rt, kernel: kernel, base: base}
	if kernel {
		e.lower = filepath.Join(base, "lower")
		if err := rootfs.BusyboxRootFS(e.lower); err != nil {
			t.Fatal(err)
		}
	}
	return e
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
	root, err := e.rootFS(t, id, filepath.Join(dir, "fs"), disk)
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

// rootFS makes a sandbox's root filesystem in fsDir: an overlay over the
// busybox lower (kernel part), or a plain empty directory (contract part).
func (e *env) rootFS(t *testing.T, id, fsDir string, diskMiB int64) (string, error) {
	if !e.kernel {
		root := filepath.Join(fsDir, "rootfs")
		return root, os.MkdirAll(root, 0o755)
	}
	root, err := rootfs.Prepare(context.Background(), fsDir, []string{e.lower}, diskMiB, nil)
	t.Cleanup(func() {
		if err := rootfs.Teardown(context.Background(), fsDir); err != nil {
			t.Errorf("teardown rootfs of %s: %v", id, err)
		}
	})
	return root, err
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
	testutil.Eventually(t, testutil.Within(timeout).Every(50*time.Millisecond), testutil.True(cond, msg))
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
