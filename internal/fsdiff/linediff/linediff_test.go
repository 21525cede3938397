package linediff

import (
	"strings"
	"testing"
)

// apply rebuilds b from a and the hunks: the property every diff must have.
func apply(a, b []string, hunks []Hunk) []string {
	var out []string
	pos := 0
	for _, h := range hunks {
		out = append(out, a[pos:h.A0]...)
		out = append(out, b[h.B0:h.B1]...)
		pos = h.A1
	}
	return append(out, a[pos:]...)
}

func edits(hunks []Hunk) int {
	n := 0
	for _, h := range hunks {
		n += h.A1 - h.A0 + h.B1 - h.B0
	}
	return n
}

func TestHunks(t *testing.T) {
	for _, tc := range []struct {
		name, a, b string
		want       []Hunk
	}{
		{"equal", "a\nb\n", "a\nb\n", nil},
		{"empty to text", "", "a\nb\n", []Hunk{{0, 0, 0, 2}}},
		{"text to empty", "a\nb\n", "", []Hunk{{0, 2, 0, 0}}},
		{"one line changed", "a\nb\nc\n", "a\nB\nc\n", []Hunk{{1, 2, 1, 2}}},
		{"insert in middle", "a\nc\n", "a\nb\nc\n", []Hunk{{1, 1, 1, 2}}},
		{"delete in middle", "a\nb\nc\n", "a\nc\n", []Hunk{{1, 2, 1, 1}}},
		{"two separate edits", "1\n2\n3\n4\n5\n", "1\nX\n3\n4\nY\n", []Hunk{{1, 2, 1, 2}, {4, 5, 4, 5}}},
		{"last line without newline", "a\nb", "a\nb\n", []Hunk{{1, 2, 1, 2}}},
		{"abcabba→cbabac", "a\nb\nc\na\nb\nb\na\n", "c\nb\na\nb\na\nc\n", nil}, // checked by distance below
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := Split([]byte(tc.a)), Split([]byte(tc.b))
			got := Hunks(a, b)
			if r := strings.Join(apply(a, b, got), ""); r != tc.b {
				t.Fatalf("applying %v to %q gives %q, want %q", got, tc.a, r, tc.b)
			}
			if tc.name == "abcabba→cbabac" {
				if d := edits(got); d != 5 { // the classic Myers example: D = 5
					t.Fatalf("edit distance %d, want 5 (%v)", d, got)
				}
				return
			}
			if len(got) != len(tc.want) {
				t.Fatalf("hunks %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("hunks %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestHunksBoundedFallback(t *testing.T) {
	var a, b []string
	for i := 0; i < 3*MaxEdits; i++ {
		a = append(a, "a"+strings.Repeat("x", i%7)+"\n")
		b = append(b, "b"+strings.Repeat("y", i%5)+"\n")
	}
	got := Hunks(a, b)
	if r := strings.Join(apply(a, b, got), ""); r != strings.Join(b, "") {
		t.Fatal("fallback diff does not rebuild b")
	}
}

func TestUnified(t *testing.T) {
	a := Split([]byte("1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"))
	b := Split([]byte("1\n2\nthree\n4\n5\n6\n7\n8\n9\n10\neleven"))
	got, add, del := Unified("a/f", "b/f", a, b, 3)
	want := `--- a/f
+++ b/f
@@ -1,6 +1,6 @@
 1
 2
-3
+three
 4
 5
 6
@@ -8,3 +8,4 @@
 8
 9
 10
+eleven
\ No newline at end of file
`
	if got != want {
		t.Fatalf("unified:\n%s\nwant:\n%s", got, want)
	}
	if add != 2 || del != 1 {
		t.Fatalf("added %d removed %d, want 2 and 1", add, del)
	}
	if s, _, _ := Unified("a", "b", a, a, 3); s != "" {
		t.Fatalf("equal texts give %q", s)
	}
}

func FuzzHunks(f *testing.F) {
	f.Add("a\nb\nc\n", "a\nc\nd\n")
	f.Add("", "x")
	f.Add("x\ny", "y\nx")
	f.Fuzz(func(t *testing.T, sa, sb string) {
		a, b := Split([]byte(sa)), Split([]byte(sb))
		if strings.Join(a, "") != sa {
			t.Fatal("Split loses bytes")
		}
		h := Hunks(a, b)
		if r := strings.Join(apply(a, b, h), ""); r != sb {
			t.Fatalf("hunks %v do not rebuild b", h)
		}
		for i := 1; i < len(h); i++ {
			if h[i].A0 <= h[i-1].A1 || h[i].B0 <= h[i-1].B1 {
				t.Fatalf("hunks %v touch or overlap", h)
			}
		}
	})
}
