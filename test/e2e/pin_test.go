package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
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
	var gone []string
	for _, id := range ids {
		s.must("rm", "-f", id)
		gone = append(gone, id)
	}
	s.settled(gone...) // their overlays are unmounted after the answer
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

// unpin makes sandboxes look like they were created before layer pins, in
// the store of a stopped server.
func unpin(t *testing.T, s *server, ids ...string) {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(s.dataDir, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, id := range ids {
		if _, err := st.UpdateSandbox(t.Context(), id, func(sb *sandbox.Sandbox) error {
			sb.Layers = nil
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLegacySandboxesGetPinned: sandboxes from before layer pins whose
// template was rebuilt meanwhile. A running one is pinned to the layers its
// overlay is mounted from (it keeps its base, and snapshots work); a
// stopped one cannot be, says so, and moves to the current layers at its
// next start, recorded.
func TestLegacySandboxesGetPinned(t *testing.T) {
	// Sandboxes from before pins also predate user namespaces: their
	// overlays name the layer directories (idmapped ones are detached fds).
	s := startServer(t, "--no-userns")
	ctxDir := t.TempDir()
	build := func(version string) {
		t.Helper()
		writeFiles(t, ctxDir, map[string]string{"Dockerfile": "FROM tiny\nRUN echo " + version + " > /etc/base-version\n"})
		if out, code := s.run("template", "build", "-t", "legacy", ctxDir); code != 0 {
			t.Fatalf("build %s: exit %d: %s", version, code, out)
		}
	}
	build("v1")
	old := templateLayers(t, s, "legacy")
	running := s.must("create", "--template", "legacy")
	stopped := s.must("create", "--template", "legacy")
	s.must("stop", stopped)
	build("v2")
	s.kill9()
	unpin(t, s, running, stopped)
	s.start()

	extra := func(id string) map[string]string {
		var v struct {
			Extra map[string]string `json:"extra"`
		}
		_ = json.Unmarshal([]byte(s.must("inspect", id)), &v)
		return v.Extra
	}
	reasons := func(id string) string {
		var evs []struct{ Reason string }
		_ = json.Unmarshal([]byte(s.must("events", id, "--json")), &evs)
		var out []string
		for _, e := range evs {
			out = append(out, e.Reason)
		}
		return strings.Join(out, " ")
	}
	if got := extra(running)["layers"]; got != strings.Join(old, ",") {
		t.Errorf("running legacy sandbox pinned to %q, want its mounted layers %q", got, strings.Join(old, ","))
	}
	if out, code := s.run("snapshot", running, "--json"); code != 0 {
		t.Errorf("snapshot of the pinned legacy sandbox: %s", out)
	}
	s.must("stop", running)
	s.must("start", running)
	if got := s.must("exec", running, "--", "cat", "/etc/base-version"); got != "v1" {
		t.Errorf("running legacy sandbox after stop/start sees %q, want v1", got)
	}

	if x := extra(stopped); x["layers"] != "" || x["layers_unpinned"] == "" || !strings.Contains(reasons(stopped), "layers_unpinned") {
		t.Errorf("stopped legacy sandbox: extra %v, events %s", x, reasons(stopped))
	}
	s.must("start", stopped)
	if got := s.must("exec", stopped, "--", "cat", "/etc/base-version"); got != "v2" {
		t.Errorf("stopped legacy sandbox after start sees %q, want the current v2", got)
	}
	if x := extra(stopped); x["layers"] != strings.Join(templateLayers(t, s, "legacy"), ",") || x["layers_unpinned"] != "" ||
		!strings.Contains(reasons(stopped), "layers_rebased") {
		t.Errorf("stopped legacy sandbox after start: extra %v, events %s", x, reasons(stopped))
	}
}
