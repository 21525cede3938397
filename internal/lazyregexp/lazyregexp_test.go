package lazyregexp

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestMatchesLikeRegexp(t *testing.T) {
	re := New(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	for s, want := range map[string]bool{"a": true, "tiny-1.0": true, "": false, "-a": false, "A": false, string(make([]byte, 64)): false} {
		if got := re.MatchString(s); got != want {
			t.Errorf("MatchString(%q) = %v, want %v", s, got, want)
		}
	}
	if m := New(`"id":\s*"([a-z0-9]+)"`).FindSubmatch([]byte(`{"id": "abc1"}`)); len(m) != 2 || string(m[1]) != "abc1" {
		t.Errorf("FindSubmatch = %q", m)
	}
}

// String must not compile: error messages quote the pattern, and a
// pattern that is never used must cost nothing.
func TestStringDoesNotCompile(t *testing.T) {
	re := New(`(`) // invalid: compiling it would panic
	if re.String() != `(` {
		t.Fatalf("String() = %q", re.String())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("an invalid pattern did not panic at its first use")
		}
	}()
	re.MatchString("x")
}

// Concurrent first uses compile once and all see the same program (run with -race).
func TestConcurrentFirstUse(t *testing.T) {
	re := New(`^[a-z]{1,64}$`)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !re.MatchString("abc") {
				t.Error("no match")
			}
		}()
	}
	wg.Wait()
	if re.Regexp() != re.Regexp() {
		t.Fatal("compiled twice")
	}
}

// TestNoEagerPatternsInBerth: no package linked into the berth binary
// compiles a regular expression in a package-level initialiser (every CLI
// call would pay for it; use New). Third-party packages are out of reach.
func TestNoEagerPatternsInBerth(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}|{{join .GoFiles \",\"}}{{end}}{{end}}", "github.com/berth-dev/berth/cmd/berth").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, files, _ := strings.Cut(line, "|")
		for _, f := range strings.Split(files, ",") {
			if f == "" {
				continue
			}
			path := filepath.Join(dir, f)
			file, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			for _, d := range file.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok || gd.Tok != token.VAR {
					continue
				}
				ast.Inspect(gd, func(n ast.Node) bool {
					if sel, ok := n.(*ast.SelectorExpr); ok {
						if id, ok := sel.X.(*ast.Ident); ok && id.Name == "regexp" && strings.HasPrefix(sel.Sel.Name, "MustCompile") {
							t.Errorf("%s: a package-level regexp.%s runs at every start of the binary; use lazyregexp.New", path, sel.Sel.Name)
						}
					}
					return true
				})
			}
		}
	}
	if checked < 100 {
		t.Fatalf("checked only %d files: go list answered %q", checked, out)
	}
}
