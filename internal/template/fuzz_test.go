package template

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzImportTarConfined imports tars made of fuzzed entries and checks that
// nothing outside the store changed, whatever the import returned. Lines
// are "kind|name|target" with kind f(ile), d(ir), s(ymlink), h(ard link);
// "{OUT}" stands for the absolute path of a directory beside the store.
//
//	go test -run '^$' -fuzz FuzzImportTarConfined ./internal/template
func FuzzImportTarConfined(f *testing.F) {
	for _, seed := range []string{
		"s|evil|{OUT}\nf|evil/victim|",
		"s|evil|{OUT}/victim\nf|evil|",
		"s|up|../../outside\nf|up/victim|",
		"d|a|\ns|a/b|..\ns|a/c|b/../..\nf|a/c/outside/victim|",
		"h|x|../outside/victim",
		"s|evil|{OUT}\nh|x|evil/victim",
		"s|l|/\nd|l/tmp/x|",
		"f|a|\ns|a|{OUT}\nf|a|",
		"d|./|\nf|etc/passwd|\ns|bin|usr/bin\nf|bin/sh|",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		base := t.TempDir()
		outside := filepath.Join(base, "outside")
		if err := os.Mkdir(outside, 0o755); err != nil {
			t.Fatal(err)
		}
		victim := filepath.Join(outside, "victim")
		if err := os.WriteFile(victim, []byte("untouched"), 0o644); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for line := range strings.Lines(strings.ReplaceAll(spec, "{OUT}", outside)) {
			kind, rest, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "|")
			name, target, _ := strings.Cut(rest, "|")
			h := &tar.Header{Name: name, Linkname: target, Mode: 0o755}
			switch kind {
			case "f":
				h.Typeflag, h.Linkname, h.Size = tar.TypeReg, "", 5
			case "d":
				h.Typeflag, h.Linkname = tar.TypeDir, ""
			case "s":
				h.Typeflag = tar.TypeSymlink
			case "h":
				h.Typeflag = tar.TypeLink
			default:
				continue
			}
			if tw.WriteHeader(h) != nil {
				return // not encodable: nothing to test
			}
			if h.Size > 0 {
				tw.Write([]byte("pwned"))
			}
		}
		if tw.Close() != nil {
			return
		}
		s, err := Open(filepath.Join(base, "data"), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = s.ImportTar(context.Background(), &buf, nil)

		if b, err := os.ReadFile(victim); err != nil || string(b) != "untouched" {
			t.Fatalf("outside file changed: %q, %v", b, err)
		}
		if fi, _ := os.Lstat(victim); fi == nil || !fi.Mode().IsRegular() {
			t.Fatalf("outside file replaced")
		}
		for d, want := range map[string]int{base: 2, outside: 1} { // data+outside; victim
			if ents, _ := os.ReadDir(d); len(ents) != want {
				t.Fatalf("%s holds %v", d, ents)
			}
		}
	})
}
