package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/oci"
)

// Raw runs the baselines: the OCI runtime driven directly, with the same
// config.json berth generates (oci.GenerateSpec: namespaces, seccomp,
// cgroup limits) over the same kind of root filesystem (rootfs.Prepare: an
// overlay of the busybox tiny rootfs on a loop-mounted ext4 workspace), but
// without berth's daemon, store, agent or API.
type Raw struct {
	dir   string // short: runsc and agent socket paths are limited
	lower string
	bins  map[string]string
	criu  string
}

// NewRaw prepares the baseline environment: a busybox rootfs as the lower
// layer. It needs root and busybox-static, as the tiny template does.
func NewRaw(bins map[string]string, criu string) (*Raw, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("raw runtime baselines need root")
	}
	dir, err := os.MkdirTemp("/tmp", "bb")
	if err != nil {
		return nil, err
	}
	x := &Raw{dir: dir, lower: filepath.Join(dir, "lower"), bins: bins, criu: criu}
	if err := rootfs.BusyboxRootFS(x.lower); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return x, nil
}

// Close removes the environment; prepared bundles are torn down by their own cleanup.
func (x *Raw) Close() error {
	// Safety net: a baseline cut short (or runsc still listing a
	// checkpointed container) must not leave sandboxes running.
	for rt := range x.bins {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if out, err := exec.CommandContext(ctx, x.bins[rt], append(x.global(rt), "list", "-q")...).Output(); err == nil {
			for _, id := range strings.Fields(string(out)) {
				_ = x.run(ctx, rt, "delete", "-f", id)
			}
		}
		cancel()
	}
	killUnder(x.dir)
	detachNetns(x.dir) // runsc's null-netns under its --root
	return os.RemoveAll(x.dir)
}

// killUnder kills every process whose command line names dir (runsc's
// sandbox and gofer processes carry their --root and bundle paths).
func killUnder(dir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), dir+"/") {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

func (x *Raw) global(rt string) []string {
	args := []string{"--root", filepath.Join(x.dir, "state-"+rt)}
	switch rt {
	case oci.Runsc:
		args = append(args, "--network=none", "--host-uds=all")
	case oci.Runc:
		if x.criu != "" {
			args = append(args, "--criu", x.criu)
		}
	}
	return args
}

func (x *Raw) cmd(ctx context.Context, rt string, args ...string) (*exec.Cmd, error) {
	bin := x.bins[rt]
	if bin == "" {
		return nil, fmt.Errorf("%s not found on this host", rt)
	}
	c := exec.CommandContext(ctx, bin, append(x.global(rt), args...)...)
	c.WaitDelay = 5 * time.Second
	return c, nil
}

// run runs a short runtime command and returns its combined output on error.
func (x *Raw) run(ctx context.Context, rt string, args ...string) error {
	c, err := x.cmd(ctx, rt, args...)
	if err != nil {
		return err
	}
	out, err := c.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", rt, args[0], err, oneLine(string(out), 300))
	}
	return nil
}

func newID(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// bundle prepares a rootfs and a config.json running args; cleanup deletes
// the container (if any) and unmounts everything.
func (x *Raw) bundle(ctx context.Context, rt, id string, args []string, memMiB int64) (string, func(), error) {
	dir := filepath.Join(x.dir, id)
	root, err := rootfs.Prepare(ctx, dir, []string{x.lower}, 2048, nil)
	if err != nil {
		return "", nil, err
	}
	cleanup := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = x.run(cctx, rt, "delete", "-f", id)
		_ = rootfs.Teardown(cctx, dir)
		_ = os.RemoveAll(dir)
	}
	if err := writeConfig(rt, id, dir, root, args, memMiB); err != nil {
		cleanup()
		return "", nil, err
	}
	return dir, cleanup, nil
}

// writeConfig writes the config.json berth would generate for id into dir.
func writeConfig(rt, id, dir, root string, args []string, memMiB int64) error {
	spec := runtime.Spec{ID: id, BundleDir: dir, RootFS: root, Hostname: id, Args: args, Cwd: "/",
		Resources: runtime.Resources{CPUMillis: 1000, MemoryBytes: memMiB << 20, Pids: 1024}}
	cfg, err := oci.GenerateSpec(spec, rt)
	if err == nil {
		// As the backend does: the spec's RLIMIT_NOFILE may exceed ours.
		var cur unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &cur) == nil {
			for i := range cfg.Process.Rlimits {
				cfg.Process.Rlimits[i].Hard = min(cfg.Process.Rlimits[i].Hard, cur.Max)
				cfg.Process.Rlimits[i].Soft = min(cfg.Process.Rlimits[i].Soft, cur.Max)
			}
		}
		var b []byte
		if b, err = json.Marshal(cfg); err == nil {
			err = os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
		}
	}
	return err
}

// EchoOK is the create-cold baseline: `RT run` of `echo ok` in the
// foreground, clock from starting the runtime to its exit with "ok"
// printed. The rootfs is prepared before the clock starts.
func (x *Raw) EchoOK(ctx context.Context, rt string) (time.Duration, error) {
	id := newID("bb")
	dir, cleanup, err := x.bundle(ctx, rt, id, []string{"/bin/echo", "ok"}, 512)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	start := time.Now()
	err = x.echoOK(ctx, rt, id, dir)
	return time.Since(start), err
}

// echoOK runs the prepared `echo ok` container id in the foreground and
// checks that it printed "ok".
func (x *Raw) echoOK(ctx context.Context, rt, id, dir string) error {
	c, err := x.cmd(ctx, rt, "run", "--bundle", dir, id)
	if err != nil {
		return err
	}
	var out, stderr bytes.Buffer
	c.Stdout, c.Stderr = &out, &stderr
	if err := c.Run(); err != nil || out.String() != "ok\n" {
		return fmt.Errorf("%s run: %v: stdout %q: %s", rt, err, out.String(), oneLine(stderr.String(), 300))
	}
	return nil
}

// EchoOKBurst is the burst baseline: n `echo ok` containers as in EchoOK,
// all bundles prepared first, then every `RT run` started at once. lat[i]
// runs from the release to container i's exit (failed ones are left out
// and reported in errList); wall is until the last has exited.
func (x *Raw) EchoOKBurst(ctx context.Context, rt string, n int) (lat []float64, wall time.Duration, errList []string) {
	type box struct {
		id, dir string
		cleanup func()
	}
	boxes := make([]box, 0, n)
	defer func() { // a few at a time, as the berth side's removeAll
		var wg sync.WaitGroup
		sem := make(chan struct{}, 4)
		for _, b := range boxes {
			wg.Add(1)
			sem <- struct{}{}
			go func() { defer wg.Done(); defer func() { <-sem }(); b.cleanup() }()
		}
		wg.Wait()
	}()
	for range n {
		id := newID("bu")
		dir, cleanup, err := x.bundle(ctx, rt, id, []string{"/bin/echo", "ok"}, 512)
		if err != nil {
			return nil, 0, []string{err.Error()}
		}
		boxes = append(boxes, box{id, dir, cleanup})
	}
	d := make([]time.Duration, n)
	fail := make([]error, n)
	gate := make(chan struct{})
	var t0 time.Time // written before the gate closes, read after
	var wg sync.WaitGroup
	for i, b := range boxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			fail[i] = x.echoOK(ctx, rt, b.id, b.dir)
			d[i] = time.Since(t0)
		}()
	}
	t0 = time.Now()
	close(gate)
	wg.Wait()
	wall = time.Since(t0)
	for i := range n {
		if fail[i] != nil {
			errList = append(errList, fail[i].Error())
			continue
		}
		lat = append(lat, ms(d[i]))
	}
	return lat, wall, errList
}

// MemoryWorkload is a process holding 1 GiB of resident, non-zero memory
// in busybox alone: dd reads 1 GiB of /dev/urandom into one buffer and then
// blocks writing it into a pipe nobody drains. /tmp/ready appears once the
// buffer is full.
var MemoryWorkload = []string{"/bin/sh", "-c",
	"dd if=/dev/urandom bs=1073741824 count=1 2>/dev/null | (head -c 1 >/dev/null; touch /tmp/ready; exec sleep 1000000)"}

// CheckpointCycles is the pause-memory / resume-memory baseline: the same
// workload started detached, then warm+runs times `RT checkpoint` (runsc:
// --direct; runc: CRIU, image synced) and `RT restore --detach` (runsc:
// --direct) of the same image. Each clock covers one runtime command.
func (x *Raw) CheckpointCycles(ctx context.Context, rt string, warm, runs int) (ckpt, restore []float64, errList []string) {
	id := newID("bm")
	dir, cleanup, err := x.bundle(ctx, rt, id, MemoryWorkload, 2048)
	if err != nil {
		return nil, nil, []string{err.Error()}
	}
	defer cleanup()
	devnull, _ := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	defer devnull.Close()
	detached := func(args ...string) error {
		c, err := x.cmd(ctx, rt, args...)
		if err != nil {
			return err
		}
		// runc/CRIU: the container's stdio must be /dev/null (not a host file or pipe).
		logf := filepath.Join(dir, "runtime.log")
		c.Args = append([]string{c.Args[0], "--log", logf}, c.Args[1:]...)
		c.Stdin, c.Stdout, c.Stderr = devnull, devnull, devnull
		if err := c.Run(); err != nil {
			b, _ := os.ReadFile(logf)
			return fmt.Errorf("%s %s: %v: %s", rt, args[0], err, oneLine(tailString(string(b), 400), 400))
		}
		return nil
	}
	if err := detached("run", "--detach", "--bundle", dir, id); err != nil {
		return nil, nil, []string{err.Error()}
	}
	cur, ids := id, []string{}
	defer func() {
		for _, id := range ids {
			_ = x.run(context.WithoutCancel(ctx), rt, "delete", "-f", id)
		}
	}()
	deadline := time.Now().Add(3 * time.Minute)
	for x.run(ctx, rt, "exec", id, "/bin/cat", "/tmp/ready") != nil {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, nil, []string{"workload did not fill 1 GiB within 3 minutes"}
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := 0; i < warm+runs; i++ {
		img := filepath.Join(dir, fmt.Sprintf("img%d", i))
		work := filepath.Join(dir, fmt.Sprintf("work%d", i))
		_ = os.MkdirAll(img, 0o700)
		_ = os.MkdirAll(work, 0o700)
		args := []string{"checkpoint", "--image-path", img}
		if rt == oci.Runsc {
			args = append(args, "--direct")
		} else {
			args = append(args, "--work-path", work)
		}
		start := time.Now()
		err := x.run(ctx, rt, append(args, cur)...)
		if err == nil && rt == oci.Runc {
			err = syncDir(img) // runsc --direct is durable on return; CRIU writes through the page cache
		}
		dc := time.Since(start)
		if err != nil {
			return ckpt, restore, append(errList, err.Error())
		}
		// runsc may still list the checkpointed container as running, so
		// the image is restored under a new id (as a berth fork would be),
		// with the config.json berth would generate for it.
		_ = x.run(ctx, rt, "delete", "-f", cur)
		cur = newID("bm")
		ids = append(ids, cur)
		if err := writeConfig(rt, cur, dir, rootfs.LayoutOf(dir).RootFS, MemoryWorkload, 2048); err != nil {
			return ckpt, restore, append(errList, err.Error())
		}
		rargs := []string{"restore", "--detach", "--image-path", img, "--bundle", dir}
		if rt == oci.Runsc {
			rargs = append(rargs, "--direct")
		} else {
			rargs = append(rargs, "--work-path", work)
		}
		start = time.Now()
		err = detached(append(rargs, cur)...)
		dr := time.Since(start)
		if err != nil {
			return ckpt, restore, append(errList, err.Error())
		}
		_ = os.RemoveAll(filepath.Join(dir, fmt.Sprintf("img%d", i-1)))
		if i >= warm {
			ckpt = append(ckpt, ms(dc))
			restore = append(restore, ms(dr))
		}
	}
	return ckpt, restore, errList
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

func tailString(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// DeleteRunning is the delete baseline: a container of `sleep` started
// detached (`RT run --detach`) over the same kind of root filesystem, then
// `RT delete --force` of it while it runs, timed alone. The rootfs is
// prepared and the container started before the clock; its unmount is
// outside it.
func (x *Raw) DeleteRunning(ctx context.Context, rt string) (time.Duration, error) {
	id := newID("bd")
	dir, cleanup, err := x.bundle(ctx, rt, id, []string{"/bin/sleep", "1000000"}, 512)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	c, err := x.cmd(ctx, rt, "run", "--detach", "--bundle", dir, id)
	if err != nil {
		return 0, err
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	logf := filepath.Join(dir, "runtime.log")
	c.Args = append([]string{c.Args[0], "--log", logf}, c.Args[1:]...)
	c.Stdin, c.Stdout, c.Stderr = devnull, devnull, devnull // a detached container's stdio must not be a pipe
	if err := c.Run(); err != nil {
		b, _ := os.ReadFile(logf)
		return 0, fmt.Errorf("%s run --detach: %v: %s", rt, err, oneLine(tailString(string(b), 400), 400))
	}
	start := time.Now()
	err = x.run(ctx, rt, "delete", "--force", id)
	return time.Since(start), err
}
