package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testutil"
)

// hostTraces lists what of sandboxes ids is on the host: mounts, loop
// devices backed by their workspace images, cgroups, runc state, network
// namespaces, veths, directories.
func (s *server) hostTraces(ids []string) []string {
	s.t.Helper()
	var out []string
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	links, _ := exec.Command("ip", "-o", "link", "show").Output()
	rc, _ := exec.Command("runc", "--root", filepath.Join(s.dataDir, "runtime", "runc"), "list", "-q").Output()
	prefix, table := "", ""
	if i := slices.Index(s.netArgs, "--network-veth-prefix"); i >= 0 {
		prefix = s.netArgs[i+1]
	}
	if i := slices.Index(s.netArgs, "--network-table"); i >= 0 {
		table = s.netArgs[i+1]
	}
	for _, id := range ids {
		dir := filepath.Join(s.dataDir, "sandboxes", id)
		for _, line := range strings.Split(string(mounts), "\n") {
			if strings.Contains(line, dir) {
				out = append(out, "mount: "+line)
			}
		}
		for _, l := range loops {
			if b, err := os.ReadFile(l); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
				out = append(out, "loop device: "+l)
			}
		}
		cgs, _ := filepath.Glob("/sys/fs/cgroup/*/berth/" + id)
		for _, c := range cgs {
			out = append(out, "cgroup: "+c)
		}
		if slices.Contains(strings.Fields(string(rc)), id) {
			out = append(out, "runc container: "+id)
		}
		if _, err := os.Lstat(filepath.Join(s.dataDir, "network", "netns", id)); err == nil {
			out = append(out, "netns: "+id)
		}
		if _, err := os.Lstat(dir); err == nil {
			out = append(out, "dir: "+dir)
		}
	}
	if prefix != "" {
		for _, id := range ids {
			// internal/network's name for the sandbox's host-side veth.
			h := sha256.Sum256([]byte(table + "/" + id))
			veth := prefix + hex.EncodeToString(h[:])[:15-len(prefix)]
			if strings.Contains(string(links), " "+veth+"@") || strings.Contains(string(links), " "+veth+":") {
				out = append(out, "veth: "+veth)
			}
		}
	}
	return out
}

// settled waits until nothing of sandboxes ids is left on the host: a
// delete answers before its teardown ends (internal/daemon/teardown.go).
func (s *server) settled(ids ...string) {
	s.t.Helper()
	testutil.Eventually(s.t, testutil.Within(30*time.Second), func() error {
		if left := s.hostTraces(ids); len(left) > 0 {
			return fmt.Errorf("left on the host: %s", strings.Join(left, "; "))
		}
		return nil
	})
}

// A delete answers before its teardown ends; a daemon killed with -9 in
// between leaves deleted rows and host resources, and the next start
// removes every one of them: mounts, loop devices, cgroups, runc state,
// network namespaces and veths, directories.
func TestDeleteKill9BeforeTeardownEnds(t *testing.T) {
	s := startServer(t)
	var ids []string
	for range 10 {
		ids = append(ids, s.create())
	}
	if len(s.hostTraces(ids)) == 0 {
		t.Fatal("hostTraces sees nothing of running sandboxes")
	}
	var wg sync.WaitGroup
	codes := make([]int, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _ = s.apiRaw("DELETE", "/v1/sandboxes/"+id, nil)
		}()
	}
	wg.Wait()
	s.kill9() // right after the last answer: two workers cannot have torn down ten
	for i, c := range codes {
		if c != 204 && c != 200 {
			t.Fatalf("DELETE %s: %d", ids[i], c)
		}
	}
	// Every answered sandbox's processes are dead already.
	for _, id := range ids {
		procs, _ := filepath.Glob("/sys/fs/cgroup/pids/berth/" + id + "/cgroup.procs")
		for _, p := range procs {
			if b, _ := os.ReadFile(p); strings.TrimSpace(string(b)) != "" {
				t.Errorf("%s: processes after its delete answered: %s", id, b)
			}
		}
	}
	left := s.hostTraces(ids)
	if len(left) == 0 {
		t.Fatal("every teardown had finished before the kill: the test did not hit the window it is about")
	}
	t.Logf("left at the kill: %d traces, e.g. %s", len(left), left[0])

	s.start() // Reconcile finishes the deletes
	var list []struct{ ID string }
	if err := json.Unmarshal([]byte(s.must("ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if slices.Contains(ids, sb.ID) {
			t.Errorf("deleted sandbox %s listed after restart", sb.ID)
		}
	}
	if left := s.hostTraces(ids); len(left) > 0 {
		t.Errorf("after restart, left on the host:\n%s", strings.Join(left, "\n"))
	}
	// And the same without a crash: a stopping daemon drains its queue.
	var more []string
	for range 4 {
		more = append(more, s.create())
	}
	for _, id := range more {
		if c, b := s.apiRaw("DELETE", "/v1/sandboxes/"+id, nil); c != 204 && c != 200 {
			t.Fatalf("DELETE %s: %d %s", id, c, b)
		}
	}
	s.stop()
	if left := s.hostTraces(more); len(left) > 0 {
		t.Errorf("after a clean stop, left on the host:\n%s", strings.Join(left, "\n"))
	}
}
