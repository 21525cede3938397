// Package fsdifftest builds the workspaces fsdiff's and merge's benchmarks
// run on (the figure: 100 changed files of a 1 GiB workspace).
package fsdifftest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Workspace is a 1 GiB base (ten sparse 100 MiB files, 1000 small files,
// 100 text files of 200 lines) and uppers that each change one line of
// every text file, as a fork that edited 100 files would.
type Workspace struct {
	Lower  string
	Uppers []string
}

// text200 is a 200-line text file whose line `edit` (if ≥ 0) says side.
func text200(n, edit int, side string) string {
	var sb strings.Builder
	for i := 0; i < 200; i++ {
		if i == edit {
			fmt.Fprintf(&sb, "line %03d of file %03d, edited by %s\n", i, n, side)
			continue
		}
		fmt.Fprintf(&sb, "line %03d of file %03d, as the template has it\n", i, n)
	}
	return sb.String()
}

// NewWorkspace builds the base and one upper per edited line number.
func NewWorkspace(tb testing.TB, editLines ...int) Workspace {
	tb.Helper()
	root := tb.TempDir()
	w := Workspace{Lower: filepath.Join(root, "lower")}
	must := func(err error) {
		if err != nil {
			tb.Fatal(err)
		}
	}
	for _, d := range []string{"big", "small", "src"} {
		must(os.MkdirAll(filepath.Join(w.Lower, d), 0o755))
	}
	for i := 0; i < 10; i++ {
		f, err := os.Create(filepath.Join(w.Lower, "big", fmt.Sprintf("blob%d", i)))
		must(err)
		must(f.Truncate(100 << 20))
		must(f.Close())
	}
	for i := 0; i < 1000; i++ {
		must(os.WriteFile(filepath.Join(w.Lower, "small", fmt.Sprintf("f%04d", i)), []byte(fmt.Sprintf("small %d\n", i)), 0o644))
	}
	for i := 0; i < 100; i++ {
		must(os.WriteFile(filepath.Join(w.Lower, "src", fmt.Sprintf("t%03d.txt", i)), []byte(text200(i, -1, "")), 0o644))
	}
	for u, line := range editLines {
		up := filepath.Join(root, fmt.Sprintf("upper%d", u))
		must(os.MkdirAll(filepath.Join(up, "src"), 0o755))
		for i := 0; i < 100; i++ {
			must(os.WriteFile(filepath.Join(up, "src", fmt.Sprintf("t%03d.txt", i)), []byte(text200(i, line, fmt.Sprintf("upper%d", u))), 0o644))
		}
		w.Uppers = append(w.Uppers, up)
	}
	return w
}
