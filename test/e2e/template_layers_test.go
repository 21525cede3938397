package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestTemplateBuildKeepsStepLayers builds a Dockerfile whose second RUN runs
// on the layer the first one just captured (as the desktop and
// code-interpreter templates do): the step sandboxes are deleted before the
// template row names their layers, and deleting them must not drop those
// layers (the timeline's Forget did). Every layer of the built template is
// stored, and a sandbox of it sees both steps' files.
func TestTemplateBuildKeepsStepLayers(t *testing.T) {
	s := startServer(t)
	ctxDir := t.TempDir()
	writeFiles(t, ctxDir, map[string]string{"Dockerfile": "FROM tiny\nRUN echo one > /one\nRUN cat /one > /two && echo two >> /two\n"})
	if out, code := s.run("template", "build", "-t", "twostep", ctxDir); code != 0 {
		t.Fatalf("build: exit %d: %s", code, out)
	}
	var all []struct {
		Name   string
		Layers []string
	}
	if err := json.Unmarshal([]byte(s.must("template", "ls", "--json")), &all); err != nil {
		t.Fatalf("template ls: %v", err)
	}
	var layers []string
	for _, x := range all {
		if x.Name == "twostep" {
			layers = x.Layers
		}
	}
	if len(layers) < 3 {
		t.Fatalf("twostep has layers %v, want the base and both RUN steps", layers)
	}
	for _, l := range layers {
		if _, err := os.Stat(filepath.Join(s.dataDir, "layers", l)); err != nil {
			t.Errorf("layer %s of the built template is not stored: %v", l, err)
		}
	}
	id := s.must("create", "--template", "twostep")
	if got := s.must("exec", id, "--", "cat", "/two"); got != "one\ntwo" {
		t.Errorf("/two in a sandbox of the template: %q", got)
	}
	s.must("rm", "-f", id)
}
