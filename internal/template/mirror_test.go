package template

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/testutil"
)

// scriptsDir holds hostcfg.sh and build-criu.sh, which implement the same
// rules for the shell set-up.
var scriptsDir = filepath.Join("..", "..", "scripts")

func TestParseSourcesList(t *testing.T) {
	in := `# a comment
deb http://mirror.test/debian bookworm main contrib
deb-src http://mirror.test/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://a.test/debian/ bookworm main
deb [ arch=amd64 trusted=yes ] http://b.test/debian trixie main # trailing comment
#deb http://commented.test/debian bookworm main
deb http://security.test/debian-security bookworm-security main
deb http://broken.test/only-uri
`
	want := []AptSource{
		{"http://mirror.test/debian", "bookworm"},
		{"https://a.test/debian/", "bookworm"},
		{"http://b.test/debian", "trixie"},
		{"http://security.test/debian-security", "bookworm-security"},
	}
	if diff := cmp.Diff(want, ParseSourcesList(strings.NewReader(in))); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestParseDeb822(t *testing.T) {
	in := `Types: deb deb-src
# a comment inside a paragraph
URIs: http://one.test/debian https://two.test/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBF...
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb-src
URIs: http://src-only.test/debian
Suites: bookworm

Types: deb
URIs: http://off.test/debian
Suites: bookworm
Enabled: no

types: deb
uris: http://lower.test/debian
suites:
 trixie
 sid
`
	want := []AptSource{
		{"http://one.test/debian", "bookworm"},
		{"http://one.test/debian", "bookworm-updates"},
		{"https://two.test/debian", "bookworm"},
		{"https://two.test/debian", "bookworm-updates"},
		{"http://lower.test/debian", "trixie"},
		{"http://lower.test/debian", "sid"},
	}
	if diff := cmp.Diff(want, ParseDeb822(strings.NewReader(in))); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

// mirrorCases are host apt configurations (files under /etc/apt) and the
// Debian mirror for bookworm each must give, "" for none. Both the Go
// resolver and scripts/hostcfg.sh run them.
var mirrorCases = []struct {
	name  string
	files map[string]string
	want  string
}{
	{"debian 12 deb822 (security and updates ignored)", map[string]string{
		"sources.list.d/debian.sources": "Types: deb\nURIs: http://mirror.test/debian-security\nSuites: bookworm-security\nComponents: main\n\n" +
			"Types: deb\n# snapshot comment\nURIs: http://mirror.test/debian/\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
	}, "http://mirror.test/debian"},
	{"one-line with signed-by, security first", map[string]string{
		"sources.list": "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://sec.test/debian-security bookworm-security main\n" +
			"deb [ arch=amd64 signed-by=/k.gpg ] https://one.test/debian bookworm main\n" +
			"deb http://upd.test/debian bookworm-updates main\n",
	}, "https://one.test/debian"},
	{"sources.list before sources.list.d, files by name", map[string]string{
		"sources.list":                "deb http://first.test/debian bookworm main\n",
		"sources.list.d/a.list":       "deb http://second.test/debian bookworm main\n",
		"sources.list.d/0.sources":    "Types: deb\nURIs: http://third.test/debian\nSuites: bookworm\n",
		"sources.list.d/z.list.save":  "deb http://ignored.test/debian bookworm main\n",
		"sources.list.d/y.disabled-x": "deb http://ignored2.test/debian bookworm main\n",
	}, "http://first.test/debian"},
	{"third-party repositories are not Debian", map[string]string{
		"sources.list.d/google.list":     "deb https://packages.test/apt cloud-sdk-bookworm main\n",
		"sources.list.d/nodesource.list": "deb [signed-by=/k.gpg] https://node.test/node_20.x nodistro main\n",
		"sources.list.d/trixie.list":     "deb http://trixie.test/debian trixie main\n",
	}, "http://trixie.test/debian"},
	{"the wanted suite wins over an earlier other Debian suite", map[string]string{
		"sources.list": "deb http://sid.test/debian sid main\ndeb http://bw.test/debian bookworm main\n",
	}, "http://bw.test/debian"},
	{"disabled deb822 and deb-src only", map[string]string{
		"sources.list.d/x.sources": "Types: deb\nURIs: http://off.test/debian\nSuites: bookworm\nEnabled: no\n\nTypes: deb-src\nURIs: http://src.test/debian\nSuites: bookworm\n",
		"sources.list":             "deb-src http://src2.test/debian bookworm main\n",
	}, ""},
	{"ubuntu host", map[string]string{
		"sources.list": "deb http://archive.test/ubuntu jammy main\ndeb http://archive.test/ubuntu jammy-updates main\n",
	}, ""},
	{"no sources at all", map[string]string{}, ""},
}

func writeApt(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestResolveDebianMirror(t *testing.T) {
	t.Setenv(MirrorEnv, "")
	for _, c := range mirrorCases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeApt(t, c.files)
			got, err := ResolveDebianMirror("", dir, "bookworm")
			if c.want == "" {
				if err == nil || !errs.Is(err, errs.FailedPrecondition) || !strings.Contains(err.Error(), MirrorEnv) {
					t.Fatalf("got %q, %v; want an error naming %s", got, err, MirrorEnv)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
	t.Run("override and environment win", func(t *testing.T) {
		dir := writeApt(t, mirrorCases[0].files)
		if got, err := ResolveDebianMirror("http://flag.test/debian/", dir, "bookworm"); err != nil || got != "http://flag.test/debian" {
			t.Errorf("override: %q, %v", got, err)
		}
		t.Setenv(MirrorEnv, "https://env.test/debian")
		if got, err := ResolveDebianMirror("", dir, "bookworm"); err != nil || got != "https://env.test/debian" {
			t.Errorf("environment: %q, %v", got, err)
		}
		t.Setenv(MirrorEnv, "mirror.test/debian")
		if _, err := ResolveDebianMirror("", dir, "bookworm"); errs.FieldOf(err) != "mirror" {
			t.Errorf("a mirror that is no URL: %v", err)
		}
	})
}

// sh runs a shell snippet with scripts/hostcfg.sh sourced.
func sh(t *testing.T, env []string, script string) (string, string, error) {
	t.Helper()
	cmd := exec.Command("sh", "-c", ". "+filepath.Join(scriptsDir, "hostcfg.sh")+"\n"+script)
	cmd.Env = append(os.Environ(), "BERTH_DEBIAN_MIRROR=", "BERTH_GOPROXY=", "GOPROXY=")
	cmd.Env = append(cmd.Env, env...)
	var out, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	return strings.TrimSpace(out.String()), stderr.String(), err
}

func TestHostcfgShDebianMirror(t *testing.T) {
	for _, c := range mirrorCases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeApt(t, c.files)
			got, stderr, err := sh(t, []string{"BERTH_APT_DIR=" + dir}, "debian_mirror bookworm")
			if c.want == "" {
				if err == nil || got != "" || !strings.Contains(stderr, "BERTH_DEBIAN_MIRROR") {
					t.Fatalf("got %q (err %v, stderr %q); want a failure naming BERTH_DEBIAN_MIRROR", got, err, stderr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q (err %v, stderr %q); want %q", got, err, stderr, c.want)
			}
		})
	}
}

// build-criu.sh --print-url derives the tarball's URL and does nothing else.
func TestBuildCriuPrintURL(t *testing.T) {
	dir := writeApt(t, mirrorCases[0].files)
	run := func(env ...string) (string, string, error) {
		cmd := exec.Command("sh", filepath.Join(scriptsDir, "build-criu.sh"), "--print-url")
		cmd.Env = append(os.Environ(), append([]string{"BERTH_DEBIAN_MIRROR=", "CRIU_DEST=/nonexistent/criu", "CRIU_WORK=/nonexistent/src"}, env...)...)
		var out, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &stderr
		err := cmd.Run()
		return strings.TrimSpace(out.String()), stderr.String(), err
	}
	if got, stderr, err := run("BERTH_APT_DIR=" + dir); err != nil || got != "http://mirror.test/debian/pool/main/c/criu/criu_4.1.1.orig.tar.xz" {
		t.Errorf("from the host's sources: %q, %v %s", got, err, stderr)
	}
	if got, _, err := run("BERTH_APT_DIR="+dir, "BERTH_DEBIAN_MIRROR=https://override.test/debian/"); err != nil || got != "https://override.test/debian/pool/main/c/criu/criu_4.1.1.orig.tar.xz" {
		t.Errorf("with BERTH_DEBIAN_MIRROR: %q, %v", got, err)
	}
	if got, stderr, err := run("BERTH_APT_DIR=" + t.TempDir()); err == nil || got != "" || !strings.Contains(stderr, "BERTH_DEBIAN_MIRROR") {
		t.Errorf("without any source: %q, %v, %q", got, err, stderr)
	}
}

func TestHostcfgShGoProxy(t *testing.T) {
	for _, c := range []struct{ name, env, want string }{
		{"first URL of a list", "BERTH_GOPROXY=https://p.test/go/,direct", "https://p.test/go"},
		{"direct and off skipped, pipe separator", "BERTH_GOPROXY=direct|off|http://q.test", "http://q.test"},
		{"nothing but direct", "BERTH_GOPROXY=direct", ""},
		{"off", "BERTH_GOPROXY=off", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, stderr, err := sh(t, []string{c.env}, "go_proxy")
			if c.want == "" {
				if err == nil || got != "" || !strings.Contains(stderr, "BERTH_GOPROXY") {
					t.Fatalf("got %q (err %v, stderr %q); want a failure naming BERTH_GOPROXY", got, err, stderr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q (err %v, stderr %q); want %q", got, err, stderr, c.want)
			}
		})
	}
	t.Run("go env GOPROXY", func(t *testing.T) {
		testutil.RequireTool(t, "go")
		got, stderr, err := sh(t, []string{"GOPROXY=https://from-go-env.test,direct"}, "go_proxy")
		if err != nil || got != "https://from-go-env.test" {
			t.Fatalf("got %q (err %v, stderr %q)", got, err, stderr)
		}
	})
}
