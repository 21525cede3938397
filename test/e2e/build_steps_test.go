package e2e

import "testing"

// TestTemplateBuildRunThenCopy builds a Dockerfile whose RUN step is
// followed by more steps: deleting a RUN step's build sandbox must not take
// the build's previous step layers with it (no template names them until
// the build ends), or the next step fails with "layer ... of template build
// is missing" (as the code-interpreter template's build did).
func TestTemplateBuildRunThenCopy(t *testing.T) {
	s := startServer(t)
	ctxDir := t.TempDir()
	writeFiles(t, ctxDir, map[string]string{"f.txt": "copied\n", "Dockerfile": `FROM tiny
RUN echo one > /one
RUN echo two > /two
COPY f.txt /f.txt
RUN cat /one /two /f.txt > /all
`})
	if out, code := s.run("template", "build", "-t", "steps", ctxDir); code != 0 {
		t.Fatalf("build: exit %d: %s", code, out)
	}
	id := s.must("create", "--template", "steps")
	if got := s.must("exec", id, "--", "cat", "/all"); got != "one\ntwo\ncopied" {
		t.Errorf("/all = %q", got)
	}
}
