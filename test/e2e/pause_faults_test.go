package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCheckpointDiskFull: when the memory image cannot be written (its
// directory is a 1 MiB tmpfs here), the pause falls back to disk and says why.
func TestCheckpointDiskFull(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	id := s.create("--runtime", "runsc")
	s.must("exec", id, "--", "sh", "-c", "echo kept > /home/user/f")
	tmp := filepath.Join(s.dataDir, "sandboxes", id, "memory.tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", tmp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(tmp, syscall.MNT_DETACH)
	s.must("pause", id, "--mode", "memory")
	v := inspect(t, s, id)
	if v.PauseActual != "disk" || v.PauseRequested != "memory" || !strings.Contains(v.Message, "memory checkpoint failed") {
		t.Fatalf("pause with a full image directory: %+v", v)
	}
	_ = syscall.Unmount(tmp, syscall.MNT_DETACH)
	s.must("resume", id)
	if out := s.must("exec", id, "--", "cat", "/home/user/f"); out != "kept" {
		t.Fatalf("file after the fallback: %q", out)
	}
}

// TestDaemonKilledDuringCheckpoint: a kill -9 of the daemon in the middle
// of a memory pause leaves the sandbox either running or paused with a
// complete image — never half — and it resumes with its files.
func TestDaemonKilledDuringCheckpoint(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	id := s.create("--runtime", "runsc", "--memory", "1024")
	s.must("exec", id, "--", "sh", "-c", "echo kept > /home/user/f")
	s.must("exec", id, "--", "sh", "-c",
		"dd if=/dev/urandom bs=536870912 count=1 2>/dev/null | (head -c1 >/dev/null; touch /tmp/ready; exec sleep 100000) >/dev/null 2>&1 &")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, code := s.run("exec", id, "--", "test", "-e", "/tmp/ready"); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("workload never became resident")
		}
		time.Sleep(200 * time.Millisecond)
	}
	done := make(chan struct{})
	go func() { s.run("pause", id, "--mode", "memory"); close(done) }()
	time.Sleep(250 * time.Millisecond) // inside the ~0.3 s checkpoint of 512 MiB
	s.kill9()
	<-done
	s.start()
	v := inspect(t, s, id)
	switch {
	case v.State == "running":
	case v.State == "paused" && (v.PauseActual == "memory" || v.PauseActual == "disk"):
		if v.PauseActual == "memory" {
			if _, err := os.Stat(filepath.Join(s.dataDir, "sandboxes", id, "memory")); err != nil {
				t.Fatalf("paused with memory but no complete image: %v", err)
			}
		}
		s.must("resume", id)
	default:
		t.Fatalf("after a kill -9 mid-checkpoint: %+v", v)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "sandboxes", id, "memory.tmp")); err == nil {
		t.Errorf("a partial image directory was left behind")
	}
	if out := s.must("exec", id, "--", "cat", "/home/user/f"); out != "kept" {
		t.Fatalf("file after the crash: %q", out)
	}
	t.Logf("settled as %s/%s", v.State, v.PauseActual)
}
