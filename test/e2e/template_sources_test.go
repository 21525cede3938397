package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type tarEntry struct {
	name, body string
	dir        bool
}

func tarLayer(t *testing.T, entries ...tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1, 0)}
		if e.dir {
			hdr = &tar.Header{Name: e.name, Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(1, 0)}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(e.body))
	}
	_ = tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is busybox (the tiny rootfs) plus a layer of files and a layer
// of OCI whiteouts deleting some of them.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	base, err := tarball.LayerFromFile(tinyTar(t))
	if err != nil {
		t.Fatal(err)
	}
	files := tarLayer(t, tarEntry{name: "opt/", dir: true}, tarEntry{name: "opt/keep/", dir: true},
		tarEntry{name: "opt/keep/a", body: "a\n"}, tarEntry{name: "opt/gone/", dir: true},
		tarEntry{name: "opt/gone/b", body: "b\n"}, tarEntry{name: "etc/extra", body: "extra\n"})
	whiteouts := tarLayer(t, tarEntry{name: "etc/.wh.extra"}, tarEntry{name: "opt/gone/", dir: true},
		tarEntry{name: "opt/gone/.wh..wh..opq"}, tarEntry{name: "opt/gone/c", body: "c\n"})
	img, err := mutate.AppendLayers(empty.Image, base, files, whiteouts)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin:/usr/bin", "GREETING=from-image"}
	cf.Config.WorkingDir = "/opt"
	cf.Config.Entrypoint = []string{"/bin/sh", "-c"}
	cf.Config.Cmd = []string{"sleep 1000"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// countingRegistry serves an in-process registry and counts blob GETs.
type countingRegistry struct {
	mu    sync.Mutex
	blobs map[string]int
}

func (c *countingRegistry) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			c.mu.Lock()
			c.blobs[r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]]++
			c.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

func TestTemplatePullFromRegistry(t *testing.T) {
	s := startServer(t)
	reg := &countingRegistry{blobs: map[string]int{}}
	srv := httptest.NewServer(reg.wrap(registry.New(registry.Logger(log.New(io.Discard, "", 0)))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := host + "/berth/test:v1"
	img := testImage(t)
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	reg.mu.Lock()
	clear(reg.blobs)
	reg.mu.Unlock()

	// Two concurrent pulls of one image download each layer once.
	start := time.Now()
	var wg sync.WaitGroup
	outs := make([]string, 2)
	codes := make([]int, 2)
	for i, n := range []string{"pulled", "pulled2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], codes[i] = s.run("template", "pull", n, ref, "--insecure")
		}()
	}
	wg.Wait()
	for i := range outs {
		if codes[i] != 0 {
			t.Fatalf("pull %d: exit %d: %s", i, codes[i], outs[i])
		}
	}
	t.Logf("two concurrent pulls of a 3-layer image: %s\n%s", time.Since(start).Round(time.Millisecond), outs[0])
	if !strings.Contains(outs[0]+outs[1], "extract: layer 2/3") {
		t.Errorf("no byte progress in pull output:\n%s\n%s", outs[0], outs[1])
	}
	layers, _ := img.Layers()
	reg.mu.Lock()
	for i, l := range layers {
		dg, _ := l.Digest()
		// The base layer is the tiny template's tar: already stored, not fetched.
		if n := reg.blobs[dg.String()]; n != 1 && (i > 0 || n != 0) {
			t.Errorf("layer %d blob %s fetched %d times, want 1", i, dg, n)
		}
	}
	reg.mu.Unlock()

	var tpls []struct {
		Name     string
		Layers   []string
		Env      map[string]string
		Workdir  string
		StartCmd []string `json:"start_cmd"`
	}
	if err := json.Unmarshal([]byte(s.must("template", "ls", "--json")), &tpls); err != nil {
		t.Fatal(err)
	}
	for _, tp := range tpls {
		if tp.Name != "pulled" {
			continue
		}
		diff, _ := layers[2].DiffID()
		if len(tp.Layers) != 3 || tp.Layers[0] != diff.Hex {
			t.Errorf("layers %v, want 3 with top %s", tp.Layers, diff.Hex)
		}
		if tp.Env["GREETING"] != "from-image" || tp.Workdir != "/opt" || strings.Join(tp.StartCmd, " ") != "/bin/sh -c sleep 1000" {
			t.Errorf("image config not carried over: %+v", tp)
		}
	}

	// The same image from an OCI layout directory and a docker-archive tarball.
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("berth/test:v1")
	if err := tarball.WriteToFile(filepath.Join(dir, "img.tar"), tag, img); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{"oci-layout:" + filepath.Join(dir, "layout"), "docker-archive:" + filepath.Join(dir, "img.tar")} {
		if out := s.must("template", "pull", "local", src); !strings.Contains(out, "local ready") {
			t.Errorf("pull %s: %s", src, out)
		}
		lid := s.must("create", "--template", "local")
		if out := s.must("exec", lid, "--", "cat", "/opt/gone/c"); out != "c" {
			t.Errorf("%s: /opt/gone/c = %q", src, out)
		}
		s.must("rm", "-f", lid)
	}
	s.must("template", "rm", "local")

	id := s.must("create", "--template", "pulled")
	out := s.must("exec", id, "--", "sh", "-c", "cat /opt/keep/a /opt/gone/c; ls /opt/gone; test -e /etc/extra && echo extra-still-there; echo done")
	if strings.Contains(out, "extra-still-there") || strings.Contains(out, "b") || !strings.Contains(out, "a\nc\nc\ndone") {
		t.Errorf("whiteouts not applied; got:\n%s", out)
	}

	// template rm is refused while a sandbox uses the template.
	if out, code := s.run("template", "rm", "pulled"); code == 0 || !strings.Contains(out, "used by") {
		t.Errorf("template rm of a template in use: exit %d: %s", code, out)
	}
	s.must("rm", "-f", id)
	s.must("template", "rm", "pulled")
	out = s.must("template", "rm", "pulled2")
	if !strings.Contains(out, "(2 layers garbage-collected)") { // the base layer is tiny's too
		t.Errorf("rm of the last user of the image's layers: %s", out)
	}
}

func TestTemplatePullErrors(t *testing.T) {
	s := startServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	out, code := s.run("template", "pull", "x", down+"/a/b:c", "--insecure")
	if code == 0 || !strings.Contains(out, "unreachable") {
		t.Errorf("pull from a closed port: exit %d: %s", code, out)
	}
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		_, _ = w.Write([]byte("this is not a manifest"))
	}))
	defer garbage.Close()
	out, code = s.run("template", "pull", "x", strings.TrimPrefix(garbage.URL, "http://")+"/a/b:c", "--insecure")
	if code == 0 || !strings.Contains(out, "invalid") {
		t.Errorf("pull from a garbage registry: exit %d: %s", code, out)
	}
	t.Logf("errors:\n%s", out)

	// A registry behind basic auth: refused without credentials, pulled with them.
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	authed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "bob" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	defer authed.Close()
	ref := strings.TrimPrefix(authed.URL, "http://") + "/private/img:v1"
	r, _ := name.ParseReference(ref, name.Insecure)
	img, err := mutate.AppendLayers(empty.Image, tarLayer(t, tarEntry{name: "hello", body: "hi\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(&authn.Basic{Username: "bob", Password: "s3cret"})); err != nil {
		t.Fatal(err)
	}
	out, code = s.run("template", "pull", "private", ref, "--insecure")
	if code == 0 || !strings.Contains(out, "wants credentials") {
		t.Errorf("anonymous pull from a basic-auth registry: exit %d: %s", code, out)
	}
	out, code = s.runAs(s.key, strings.NewReader("s3cret\n"), "template", "pull", "private", ref, "--insecure", "--username", "bob", "--password-stdin")
	if code != 0 || !strings.Contains(out, "private ready") {
		t.Errorf("pull with basic auth: exit %d: %s", code, out)
	}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func layerCount(t *testing.T, dataDir string) int {
	ents, _ := os.ReadDir(filepath.Join(dataDir, "layers"))
	n := 0
	for _, e := range ents {
		if e.IsDir() && len(e.Name()) == 64 {
			n++
		}
	}
	return n
}

const testDockerfile = `# a small app on the busybox template
FROM tiny
ARG GREETING=hello
COPY lock.txt /app/lock.txt
RUN cat /app/lock.txt > /app/installed && \
    echo "$GREETING" >> /app/installed && echo built-ok
ENV APP_MODE=prod
WORKDIR /app
CMD ["sh", "-c", "cat /app/installed"]
`

func TestTemplateBuildDockerfile(t *testing.T) {
	s := startServer(t)
	ctxDir := t.TempDir()
	writeFiles(t, ctxDir, map[string]string{"Dockerfile": testDockerfile, "lock.txt": "v1\n"})

	build := func() (string, time.Duration) {
		start := time.Now()
		out, code := s.run("template", "build", "-t", "app", ctxDir)
		if code != 0 {
			t.Fatalf("build: exit %d: %s", code, out)
		}
		return out, time.Since(start)
	}
	out, took := build()
	t.Logf("first build: %s\n%s", took.Round(time.Millisecond), out)
	if !strings.Contains(out, "built-ok") || strings.Contains(out, "(cached)") {
		t.Errorf("first build should run every step and show RUN output:\n%s", out)
	}
	id := s.must("create", "--template", "app")
	if got := s.must("exec", id, "--", "cat", "/app/installed"); got != "v1\nhello" {
		t.Errorf("built file: %q", got)
	}
	s.must("rm", "-f", id)

	out, took = build()
	t.Logf("rebuild, nothing changed: %s\n%s", took.Round(time.Millisecond), out)
	if strings.Contains(out, "cache miss") || strings.Count(out, "(cached)") != 2 {
		t.Errorf("unchanged rebuild should be all cache hits:\n%s", out)
	}

	writeFiles(t, ctxDir, map[string]string{"lock.txt": "v2\n"})
	out, took = build()
	t.Logf("rebuild after changing lock.txt: %s\n%s", took.Round(time.Millisecond), out)
	if !strings.Contains(out, "[3/7] step: COPY lock.txt /app/lock.txt") || strings.Count(out, "(cache miss)") != 2 || !strings.Contains(out, "built-ok") {
		t.Errorf("changing lock.txt should rebuild COPY and RUN:\n%s", out)
	}
	var tpls []struct {
		Name     string
		Env      map[string]string
		Workdir  string
		StartCmd []string `json:"start_cmd"`
	}
	_ = json.Unmarshal([]byte(s.must("template", "ls", "--json")), &tpls)
	for _, tp := range tpls {
		if tp.Name == "app" && (tp.Env["APP_MODE"] != "prod" || tp.Workdir != "/app" || strings.Join(tp.StartCmd, " ") != "sh -c cat /app/installed") {
			t.Errorf("ENV/WORKDIR/CMD not recorded: %+v", tp)
		}
	}
	id = s.must("create", "--template", "app")
	if got := s.must("exec", id, "--", "cat", "/app/installed"); got != "v2\nhello" {
		t.Errorf("rebuilt file: %q", got)
	}
	if got := s.must("exec", id, "--", "sh", "-c", "echo $APP_MODE"); got != "prod" {
		t.Errorf("the template's ENV in a sandbox: APP_MODE=%q", got)
	}
	// In use: rm refused.
	if out, code := s.run("template", "rm", "app"); code == 0 || !strings.Contains(out, "used by") {
		t.Errorf("template rm while in use: exit %d: %s", code, out)
	}
	s.must("rm", "-f", id)
}

func TestTemplateBuildFailures(t *testing.T) {
	s := startServer(t)
	ctxDir := t.TempDir()
	writeFiles(t, ctxDir, map[string]string{
		"Dockerfile": "FROM tiny\nRUN echo about-to-fail && touch /marker && exit 3\n",
		"Bad":        "FROM tiny\nRUN true\nFROBNICATE x\n",
	})
	before := layerCount(t, s.dataDir)
	out, code := s.run("template", "build", "-t", "broken", ctxDir)
	if code == 0 || !strings.Contains(out, "about-to-fail") || !strings.Contains(out, "exit status 3") || !strings.Contains(out, "Dockerfile:2") {
		t.Errorf("failing RUN: exit %d: %s", code, out)
	}
	if after := layerCount(t, s.dataDir); after != before {
		t.Errorf("a failing RUN left layers: %d before, %d after", before, after)
	}
	t.Logf("failing RUN:\n%s", out)

	out, code = s.run("template", "build", "-t", "bad", "-f", filepath.Join(ctxDir, "Bad"), ctxDir)
	if code == 0 || !strings.Contains(out, "Bad:3: unknown instruction \"FROBNICATE\"") {
		t.Errorf("syntax error: exit %d: %s", code, out)
	}
	var list []struct{ ID string }
	_ = json.Unmarshal([]byte(s.must("ls", "--json")), &list)
	if len(list) != 0 {
		t.Errorf("build sandboxes left behind: %v", list)
	}
}
