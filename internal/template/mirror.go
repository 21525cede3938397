package template

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// The Debian mirror the default template is debootstrapped from is the
// host's own (its apt sources), so a host behind a mirror or a proxy needs
// no configuration and the project names no mirror. BERTH_DEBIAN_MIRROR
// overrides it. scripts/hostcfg.sh implements the same rules for the shell
// scripts; mirror_test.go holds both to one table.

// MirrorEnv overrides the Debian mirror taken from the host's apt sources.
const MirrorEnv = "BERTH_DEBIAN_MIRROR"

// AptSource is one "deb" entry of an apt sources file (one URI, one suite).
type AptSource struct {
	URI   string
	Suite string
}

// debianSuites are the suite names (codenames and aliases) of Debian
// itself: an entry with one of them is a Debian mirror, not a third-party
// repository or another distribution's archive.
var debianSuites = map[string]bool{
	"oldoldstable": true, "oldstable": true, "stable": true, "testing": true, "unstable": true, "sid": true,
	"experimental": true, "buster": true, "bullseye": true, "bookworm": true, "trixie": true, "forky": true, "duke": true,
}

// ParseSourcesList reads the one-line format (sources.list, *.list):
// "deb [opt=val ...] URI SUITE [COMPONENT...]". deb-src and comments are
// skipped.
func ParseSourcesList(r io.Reader) []AptSource {
	var out []AptSource
	sc := bufio.NewScanner(io.LimitReader(r, 1<<20))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if len(f) > 0 && strings.HasPrefix(f[0], "[") {
			// Options may hold spaces: "[ arch=amd64 signed-by=/k.gpg ]".
			for len(f) > 0 {
				end := strings.HasSuffix(f[0], "]")
				f = f[1:]
				if end {
					break
				}
			}
		}
		if len(f) >= 2 {
			out = append(out, AptSource{URI: f[0], Suite: f[1]})
		}
	}
	return out
}

// ParseDeb822 reads the deb822 format (*.sources): paragraphs of Types,
// URIs, Suites (each a list) and Enabled; a line starting with a blank
// continues the field before it (an inline Signed-By key, a long list).
func ParseDeb822(r io.Reader) []AptSource {
	var out []AptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		if strings.EqualFold(fields["enabled"], "no") || !contains(strings.Fields(fields["types"]), "deb") {
			fields, last = map[string]string{}, ""
			return
		}
		for _, u := range strings.Fields(fields["uris"]) {
			for _, s := range strings.Fields(fields["suites"]) {
				out = append(out, AptSource{URI: u, Suite: s})
			}
		}
		fields, last = map[string]string{}, ""
	}
	sc := bufio.NewScanner(io.LimitReader(r, 1<<20))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				last = ""
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// HostSources reads the apt sources under aptDir (normally /etc/apt) in
// apt's order: sources.list, then sources.list.d/ by name (*.list one-line,
// *.sources deb822; other names, like *.disabled, are ignored).
func HostSources(aptDir string) []AptSource {
	var out []AptSource
	read := func(p string, parse func(io.Reader) []AptSource) {
		f, err := os.Open(p)
		if err != nil {
			return
		}
		defer f.Close()
		out = append(out, parse(f)...)
	}
	read(filepath.Join(aptDir, "sources.list"), ParseSourcesList)
	ents, _ := os.ReadDir(filepath.Join(aptDir, "sources.list.d"))
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(aptDir, "sources.list.d", n)
		switch {
		case strings.HasSuffix(n, ".list"):
			read(p, ParseSourcesList)
		case strings.HasSuffix(n, ".sources"):
			read(p, ParseDeb822)
		}
	}
	return out
}

// DebianMirror picks the Debian archive among sources: the first http(s)
// entry for suite, else the first for any Debian suite. Security, updates,
// backports and proposed-updates suites are skipped: they live in other
// archives (debian-security) or carry only part of a release.
func DebianMirror(sources []AptSource, suite string) (string, bool) {
	fallback := ""
	for _, s := range sources {
		if !strings.HasPrefix(s.URI, "http://") && !strings.HasPrefix(s.URI, "https://") {
			continue
		}
		if strings.Contains(s.Suite, "-") || strings.Contains(s.Suite, "/") {
			continue // bookworm-security, bookworm-updates, bookworm-backports, buster/updates, ...
		}
		uri := strings.TrimRight(s.URI, "/")
		if s.Suite == suite {
			return uri, true
		}
		if fallback == "" && debianSuites[s.Suite] {
			fallback = uri
		}
	}
	return fallback, fallback != ""
}

// ResolveDebianMirror is the mirror to fetch suite from: override if set,
// else $BERTH_DEBIAN_MIRROR, else the host's apt sources under aptDir.
func ResolveDebianMirror(override, aptDir, suite string) (string, error) {
	if override == "" {
		override = os.Getenv(MirrorEnv)
	}
	if override != "" {
		if !strings.HasPrefix(override, "http://") && !strings.HasPrefix(override, "https://") {
			return "", errs.Field("mirror", "%s must be an http(s) URL of a Debian archive, got %q", MirrorEnv, override)
		}
		return strings.TrimRight(override, "/"), nil
	}
	if m, ok := DebianMirror(HostSources(aptDir), suite); ok {
		return m, nil
	}
	return "", errs.E(errs.FailedPrecondition,
		"no Debian mirror in the host's apt sources (%s/sources.list, %s/sources.list.d/*.list, *.sources); set %s to the URL of a Debian archive",
		aptDir, aptDir, MirrorEnv)
}
