package oci

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/runtimetest"
)

// fakeCRIU installs a stand-in for the criu binary: "hang" never answers
// (its child sleep marks the process group that must be killed), "fail"
// exits at once with an error. It returns the script and the marker that
// every process it leaves behind carries on its command line.
func fakeCRIU(t *testing.T, behaviour string) (path, marker string) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	marker = fmt.Sprint(900000 + binary.BigEndian.Uint32(b[:])%99999)
	body := map[string]string{
		"hang": "sleep " + marker + " &\nwait\n",
		"fail": "echo 'criu: simulated failure " + marker + "' >&2\nexit 1\n",
	}[behaviour]
	path = filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, marker
}

// leftovers lists processes whose command line carries marker.
func leftovers(marker string) string {
	out, _ := exec.Command("pgrep", "-af", "sleep "+marker).Output()
	return strings.TrimSpace(string(out))
}

func TestCheckpointProbeFaults(t *testing.T) {
	runtimetest.RequireHost(t, "runc", rootfs.BusyboxPath)
	for _, behaviour := range []string{"hang", "fail"} {
		t.Run(behaviour, func(t *testing.T) {
			criu, marker := fakeCRIU(t, behaviour)
			cache := t.TempDir()
			cfg := Config{Root: filepath.Join(t.TempDir(), "state"), CRIU: criu, ProbeCacheDir: cache, ProbeTimeout: 3 * time.Second}
			o, err := New(Runc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			caps := o.Capabilities(ctx)
			if caps.Checkpoint {
				t.Fatalf("runc with a criu that %ss reports memory checkpoints", behaviour)
			}
			want := map[string]string{"hang": "did not finish within 3s", "fail": "trial checkpoint of a throwaway container failed"}[behaviour]
			if !strings.Contains(caps.CheckpointReason, want) {
				t.Errorf("reason = %q, want it to contain %q", caps.CheckpointReason, want)
			}
			if l := leftovers(marker); l != "" {
				t.Errorf("the stand-in criu's processes outlived the probe:\n%s", l)
			}
			if _, err := os.Stat(cfg.Root + "-probe"); !os.IsNotExist(err) {
				t.Errorf("probe dir left behind: %v", err)
			}
			if err := o.Checkpoint(ctx, "x1", filepath.Join(t.TempDir(), "img")); !errs.Is(err, errs.FailedPrecondition) {
				t.Errorf("Checkpoint after a failed probe: %v, want failed_precondition", err)
			}
			// A second server start with the same kernel and criu reads the verdict.
			o2, err := New(Runc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			<-o2.StartProbe(ctx)
			if !o2.probe.Cached || o2.probe.OK || o2.probe.Reason != caps.CheckpointReason {
				t.Errorf("second probe = %+v, want the cached verdict %q", o2.probe, caps.CheckpointReason)
			}
		})
	}
}

// TestCheckpointProbeRealCRIU: the trial with the host's CRIU, shaped as
// runc sandboxes are with and without a user namespace. Where CRIU can
// checkpoint a sandbox without one, it can with one (CRIU runs in the
// netns the sandbox joins; see checkpoint_linux.go).
func TestCheckpointProbeRealCRIU(t *testing.T) {
	verdict := map[bool]ProbeResult{}
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			o := newBackend(t, Runc)
			if userns {
				o.cfg.ProbeUserNS = &runtime.IDMap{HostID: 2000000000, Size: 65536}
			}
			<-o.StartProbe(context.Background())
			p := o.probe
			verdict[userns] = p
			t.Logf("runc checkpoint probe on kernel %s: ok=%v reason=%q (%d ms)", p.Kernel, p.OK, p.Reason, p.Millis)
			if p.Kernel == "" || len(p.CRIU) != 64 {
				t.Errorf("probe verdict lacks its key: %+v", p)
			}
			if !p.OK && p.Reason == "" {
				t.Errorf("probe says no without a reason")
			}
			if caps := o.Capabilities(context.Background()); caps.Checkpoint != p.OK {
				t.Errorf("Capabilities().Checkpoint = %v, probe said %v", caps.Checkpoint, p.OK)
			}
			if _, err := os.Stat(o.probeDir()); !os.IsNotExist(err) {
				t.Errorf("probe dir left behind: %v", err)
			}
		})
	}
	if plain, mapped := verdict[false], verdict[true]; plain.OK && !mapped.OK {
		t.Errorf("CRIU checkpoints a runc sandbox here, but not one in a user namespace: %s", mapped.Reason)
	}
}

// TestCheckpointProbeDirPlanted: the user-namespaced trial's directory has
// a fixed name in the shared temp dir. A local user who plants it first —
// as a symlink to a directory of the host, or as a directory of its own —
// gets the trial refused (not cached), and nothing is created, chmodded or
// removed through what was planted.
func TestCheckpointProbeDirPlanted(t *testing.T) {
	runtimetest.RequireHost(t, "runc", rootfs.BusyboxPath)
	criu, _ := fakeCRIU(t, "fail")
	for _, plant := range []string{"symlink", "foreign dir"} {
		t.Run(plant, func(t *testing.T) {
			cfg := Config{Root: filepath.Join(t.TempDir(), "state"), CRIU: criu, ProbeCacheDir: t.TempDir(),
				ProbeTimeout: 3 * time.Second, ProbeUserNS: &runtime.IDMap{HostID: 2000000000, Size: 65536}}
			o, err := New(Runc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			dir := o.probeDir()
			victim := t.TempDir() // stands for a host directory such as /etc
			if err := os.Chmod(victim, 0o755); err != nil {
				t.Fatal(err)
			}
			canary := filepath.Join(victim, "canary")
			if err := os.WriteFile(canary, []byte("host"), 0o644); err != nil {
				t.Fatal(err)
			}
			switch plant {
			case "symlink":
				if err := os.Symlink(victim, dir); err != nil {
					t.Fatal(err)
				}
			case "foreign dir":
				if err := os.Mkdir(dir, 0o777); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(dir, 65534, 65534); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "mine"), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			<-o.StartProbe(ctx)
			if o.probe.OK || o.probe.Cached || !strings.Contains(o.probe.Reason, "not a private root-owned directory") {
				t.Errorf("probe over a planted %s = %+v, want a refusal naming it", plant, o.probe)
			}
			if b, err := os.ReadFile(canary); err != nil || string(b) != "host" {
				t.Errorf("canary: %q, %v", b, err)
			}
			if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("victim dir mode changed: %v, %v", fi.Mode(), err)
			}
			ents, _ := os.ReadDir(victim)
			if len(ents) != 1 {
				t.Errorf("the trial wrote into the symlink's target: %v", ents)
			}
			if plant == "foreign dir" {
				if _, err := os.Stat(filepath.Join(dir, "mine")); err != nil {
					t.Errorf("the trial removed a local user's file: %v", err)
				}
			}
		})
	}
}

// TestCheckpointBounded: a checkpoint whose criu hangs or fails returns
// within its context's bound, kills the helper's whole process group and
// leaves the container running.
func TestCheckpointBounded(t *testing.T) {
	runtimetest.RequireHost(t, "runc", rootfs.BusyboxPath)
	for _, behaviour := range []string{"hang", "fail"} {
		t.Run(behaviour, func(t *testing.T) {
			criu, marker := fakeCRIU(t, behaviour)
			base, err := os.MkdirTemp("", "bck")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(base) })
			o, err := New(Runc, Config{Root: filepath.Join(base, "state"), CRIU: criu, TrustCRIU: true})
			if err != nil {
				t.Fatal(err)
			}
			root := filepath.Join(base, "rootfs")
			if err := rootfs.BusyboxRootFS(root); err != nil {
				t.Fatal(err)
			}
			spec := runtime.Spec{ID: "bck" + marker, BundleDir: filepath.Join(base, "bundle"), RootFS: root,
				Args: []string{"/bin/sh", "-c", probeScript}, LogPath: filepath.Join(base, "runtime.log")}
			ctx := context.Background()
			if err := o.Run(ctx, spec); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = o.Delete(context.Background(), spec.ID) })
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			start := time.Now()
			err = o.Checkpoint(cctx, spec.ID, filepath.Join(base, "img"))
			took := time.Since(start)
			if err == nil {
				t.Fatalf("Checkpoint with a criu that %ss succeeded", behaviour)
			}
			t.Logf("Checkpoint returned after %v: %v", took, err)
			if took > 15*time.Second {
				t.Errorf("Checkpoint took %v with a 2s bound", took)
			}
			if l := leftovers(marker); l != "" {
				t.Errorf("the stand-in criu's processes outlived the checkpoint:\n%s", l)
			}
			if st, err := o.State(ctx, spec.ID); err != nil || st.State != "running" {
				t.Errorf("container after the failed checkpoint: %+v, %v; want running", st, err)
			}
		})
	}
}
