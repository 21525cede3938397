package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// templateLayers is the layer digests of template name, top first.
func templateLayers(t *testing.T, s *server, name string) []string {
	t.Helper()
	var list []struct {
		Name   string   `json:"name"`
		Layers []string `json:"layers"`
	}
	if err := json.Unmarshal([]byte(s.must("template", "ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	for _, tp := range list {
		if tp.Name == name {
			return tp.Layers
		}
	}
	t.Fatalf("no template %s", name)
	return nil
}

// collectLayers makes the server garbage-collect layers (template rm runs
// the collector) without touching any template a test uses.
func collectLayers(t *testing.T, s *server) {
	t.Helper()
	s.must("template", "import", "gc-trigger", tinyTar(t))
	s.must("template", "rm", "gc-trigger")
}

// TestSandboxKeepsItsLayers: a sandbox pins the layers it was created from.
// After its template is rebuilt it still boots on them (stop/start, disk
// pause), its snapshots and forks carry them, template rm and layer GC keep
// them while it exists, and they are collected once it is deleted.
func TestSandboxKeepsItsLayers(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	ctxDir := t.TempDir()
	build := func(version string) {
		t.Helper()
		writeFiles(t, ctxDir, map[string]string{"Dockerfile": "FROM tiny\nRUN echo " + version + " > /etc/base-version\n"})
		if out, code := s.run("template", "build", "-t", "pinned", ctxDir); code != 0 {
			t.Fatalf("build %s: exit %d: %s", version, code, out)
		}
	}
	base := func(id string) string {
		t.Helper()
		return s.must("exec", id, "--", "cat", "/etc/base-version")
	}
	layerDir := func(dg string) string { return filepath.Join(s.dataDir, "layers", dg) }

	build("v1")
	old := templateLayers(t, s, "pinned")
	ids := map[string]string{}
	for _, rt := range []string{"runc", "runsc"} {
		id := s.must("create", "--template", "pinned", "--runtime", rt)
		s.must("exec", id, "--", "sh", "-c", "echo mine > /home/user/work")
		ids[rt] = id
	}
	build("v2")
	if now := templateLayers(t, s, "pinned"); strings.Join(now, ",") == strings.Join(old, ",") {
		t.Fatalf("rebuild with another Dockerfile kept the layers %v", now)
	}
	if fresh := s.must("create", "--template", "pinned"); base(fresh) != "v2" {
		t.Fatalf("a new sandbox of the rebuilt template sees %q", base(fresh))
	} else {
		s.must("rm", "-f", fresh)
	}

	// No t.Run: the server's helpers fail the test that started it.
	for rt, id := range ids {
		func() {
			t.Logf("%s sandbox %s", rt, id)
			var v struct {
				Extra map[string]string `json:"extra"`
			}
			_ = json.Unmarshal([]byte(s.must("inspect", id)), &v)
			if v.Extra["layers"] != strings.Join(old, ",") {
				t.Errorf("pinned layers %q, want %q", v.Extra["layers"], strings.Join(old, ","))
			}
			s.must("stop", id)
			s.must("start", id)
			if got := base(id); got != "v1" {
				t.Fatalf("after stop/start the sandbox boots on %q, want its own v1 base", got)
			}
			s.must("pause", id, "--mode", "disk")
			s.must("resume", id)
			if got := base(id); got != "v1" {
				t.Fatalf("after a disk pause the sandbox boots on %q, want v1", got)
			}
			snapOut, code := s.run("snapshot", id, "--json")
			if code != 0 {
				t.Fatalf("snapshot of a sandbox of a rebuilt template: %s", snapOut)
			}
			var snap struct {
				ID     string   `json:"id"`
				Layers []string `json:"layers"`
			}
			if err := json.Unmarshal([]byte(snapOut), &snap); err != nil {
				t.Fatal(err)
			}
			if strings.Join(snap.Layers[1:], ",") != strings.Join(old, ",") {
				t.Errorf("snapshot layers %v, want the workspace over %v", snap.Layers, old)
			}
			child := s.must("create", "--from-snapshot", snap.ID)
			if got := s.must("exec", child, "--", "cat", "/etc/base-version", "/home/user/work"); got != "v1\nmine" {
				t.Errorf("sandbox from the snapshot sees %q, want v1 and the workspace", got)
			}
			res := s.fork(id, 1)
			kid := res.Sandboxes[0].ID
			if got := s.must("exec", kid, "--", "cat", "/etc/base-version", "/home/user/work"); got != "v1\nmine" {
				t.Errorf("fork child (%s) sees %q, want v1 and the workspace", res.Mode, got)
			}
			if got := base(id); got != "v1" {
				t.Errorf("parent after fork sees %q", got)
			}
			s.must("rm", "-f", child, kid)
			for _, sn := range []string{snap.ID, res.Snapshot} {
				if sn != "" {
					s.run("snapshot", "rm", sn)
				}
			}
		}()
	}

	// template rm of the template while its sandboxes live is refused,
	// and the layers they run on stay.
	if out, code := s.run("template", "rm", "pinned"); code != 4 {
		t.Errorf("template rm with live sandboxes: exit %d: %s", code, out)
	}
	// Stopped sandboxes mount nothing: only their pins keep the old layers
	// from the collector.
	for _, id := range ids {
		s.must("stop", id)
	}
	collectLayers(t, s)
	for _, dg := range old {
		if _, err := os.Stat(layerDir(dg)); err != nil {
			t.Fatalf("layer %s of stopped sandboxes collected: %v", dg, err)
		}
	}
	for rt, id := range ids {
		s.must("start", id)
		if got := base(id); got != "v1" {
			t.Errorf("%s after GC boots on %q", rt, got)
		}
	}

	// Deleted, they release their layers; the template's current ones stay.
	for _, id := range ids {
		s.must("rm", "-f", id)
	}
	collectLayers(t, s)
	current := map[string]bool{}
	for _, dg := range templateLayers(t, s, "pinned") {
		current[dg] = true
		if _, err := os.Stat(layerDir(dg)); err != nil {
			t.Errorf("current layer %s collected: %v", dg, err)
		}
	}
	for _, dg := range old {
		if _, err := os.Stat(layerDir(dg)); !current[dg] && err == nil {
			t.Errorf("layer %s of the deleted sandboxes not collected", dg)
		}
	}
}
