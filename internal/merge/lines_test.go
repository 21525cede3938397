package merge

import (
	"bytes"
	"strings"
	"testing"
)

func TestLines(t *testing.T) {
	const base = "1\n2\n3\n4\n5\n6\n7\n"
	for _, tc := range []struct {
		name, ours, theirs string
		favor              Favor
		want               string
		conflicts          int
	}{
		{"neither changed", base, base, FavorNone, base, 0},
		{"only ours", "1\n2\nX\n4\n5\n6\n7\n", base, FavorNone, "1\n2\nX\n4\n5\n6\n7\n", 0},
		{"only theirs", base, "1\n2\n3\n4\n5\n6\n", FavorNone, "1\n2\n3\n4\n5\n6\n", 0},
		{"different lines", "O\n2\n3\n4\n5\n6\n7\n", "1\n2\n3\n4\n5\n6\nT\n", FavorNone, "O\n2\n3\n4\n5\n6\nT\n", 0},
		{"same change both sides", "1\n2\nX\n4\n5\n6\n7\n", "1\n2\nX\n4\n5\n6\n7\n", FavorNone, "1\n2\nX\n4\n5\n6\n7\n", 0},
		{"insertions far apart", "0\n1\n2\n3\n4\n5\n6\n7\n", "1\n2\n3\n4\n5\n6\n7\n8\n", FavorNone, "0\n1\n2\n3\n4\n5\n6\n7\n8\n", 0},
		{"delete and edit elsewhere", "1\n3\n4\n5\n6\n7\n", "1\n2\n3\n4\n5\nsix\n7\n", FavorNone, "1\n3\n4\n5\nsix\n7\n", 0},
		{
			"same line", "1\n2\nours\n4\n5\n6\n7\n", "1\n2\ntheirs\n4\n5\n6\n7\n", FavorNone,
			"1\n2\n<<<<<<< ours\nours\n||||||| base\n3\n=======\ntheirs\n>>>>>>> theirs\n4\n5\n6\n7\n", 1,
		},
		{"same line, ours wins", "1\n2\nours\n4\n5\n6\n7\n", "1\n2\ntheirs\n4\n5\n6\nT\n", FavorOurs, "1\n2\nours\n4\n5\n6\nT\n", 0},
		{"same line, theirs wins", "1\n2\nours\n4\n5\n6\n7\n", "O\n2\ntheirs\n4\n5\n6\n7\n", FavorTheirs, "O\n2\ntheirs\n4\n5\n6\n7\n", 0},
		{
			"both insert at the same place", "1\n2\n3\na\n4\n5\n6\n7\n", "1\n2\n3\nb\n4\n5\n6\n7\n", FavorNone,
			"1\n2\n3\n<<<<<<< ours\na\n||||||| base\n=======\nb\n>>>>>>> theirs\n4\n5\n6\n7\n", 1,
		},
		{
			"no final newline", "1\n2\n3\n4\n5\n6\nours", "1\n2\n3\n4\n5\n6\ntheirs", FavorNone,
			"1\n2\n3\n4\n5\n6\n<<<<<<< ours\nours\n||||||| base\n7\n=======\ntheirs\n>>>>>>> theirs\n", 1,
		},
		{"two conflicts", "a\n2\n3\n4\n5\n6\nz\n", "b\n2\n3\n4\n5\n6\ny\n", FavorNone, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, n := Lines([]byte(base), []byte(tc.ours), []byte(tc.theirs), tc.favor)
			if n != tc.conflicts {
				t.Errorf("conflicts %d, want %d\n%s", n, tc.conflicts, got)
			}
			if tc.want != "" && string(got) != tc.want {
				t.Errorf("merged:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// FuzzLines checks the laws of a three-way merge on arbitrary texts.
func FuzzLines(f *testing.F) {
	f.Add("1\n2\n3\n", "1\nX\n3\n", "1\n2\nY\n")
	f.Add("a\nb\n", "a\nc\n", "a\nd\n")
	f.Add("", "x\n", "y\n")
	f.Add("a\nb\nc", "b\nc", "a\nb")
	f.Fuzz(func(t *testing.T, base, ours, theirs string) {
		b, o, th := []byte(base), []byte(ours), []byte(theirs)
		if got, n := Lines(b, b, th, FavorNone); n != 0 || !bytes.Equal(got, th) {
			t.Fatalf("ours unchanged: got %q (%d conflicts), want theirs %q", got, n, th)
		}
		if got, n := Lines(b, o, b, FavorNone); n != 0 || !bytes.Equal(got, o) {
			t.Fatalf("theirs unchanged: got %q (%d conflicts), want ours %q", got, n, o)
		}
		if got, n := Lines(b, o, o, FavorNone); n != 0 || !bytes.Equal(got, o) {
			t.Fatalf("same change: got %q (%d conflicts), want %q", got, n, o)
		}
		m1, n1 := Lines(b, o, th, FavorNone)
		m2, n2 := Lines(b, th, o, FavorNone)
		if n1 != n2 {
			t.Fatalf("conflicts %d vs %d when the sides swap", n1, n2)
		}
		if n1 == 0 && !bytes.Equal(m1, m2) {
			t.Fatalf("clean merge depends on the side: %q vs %q", m1, m2)
		}
		if n1 > 0 && strings.Count(string(m1), markerOurs) < n1 {
			t.Fatalf("%d conflicts but fewer markers in %q", n1, m1)
		}
		for _, fav := range []Favor{FavorOurs, FavorTheirs} {
			if _, n := Lines(b, o, th, fav); n != 0 {
				t.Fatalf("favor %d left %d conflicts", fav, n)
			}
		}
		// Favouring a side equals the clean merge when there is no conflict.
		if n1 == 0 {
			if got, _ := Lines(b, o, th, FavorOurs); !bytes.Equal(got, m1) {
				t.Fatalf("favor ours %q differs from the clean merge %q", got, m1)
			}
		}
	})
}
