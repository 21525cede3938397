package merge

import (
	"slices"
	"strings"

	"github.com/berth-dev/berth/internal/fsdiff/linediff"
)

// Favor says which side wins a conflicting region of a line merge.
type Favor int

// Line merge outcomes for conflicting regions.
const (
	FavorNone   Favor = iota // write conflict markers
	FavorOurs                // take ours' lines (git merge -X ours)
	FavorTheirs              // take theirs' lines
)

// Markers are the conflict marker lines, diff3 style.
const (
	markerOurs   = "<<<<<<< ours\n"
	markerBase   = "||||||| base\n"
	markerSep    = "=======\n"
	markerTheirs = ">>>>>>> theirs\n"
)

// Lines merges ours and theirs, both derived from base, line by line with
// diff3 semantics: a region only one side changed takes that side's lines,
// a region both changed the same way takes them once, and a region both
// changed differently (their changes overlap, or insert at the same place
// or right against the other's change) is a conflict. A conflict is
// written with markers (ours, base, theirs) unless favor picks a side.
// It returns the merged text and the number of conflicting regions.
func Lines(base, ours, theirs []byte, favor Favor) ([]byte, int) {
	b, o, t := linediff.Split(base), linediff.Split(ours), linediff.Split(theirs)
	out, n := mergeLines(b, o, t, favor)
	return []byte(strings.Join(out, "")), n
}

type sided struct {
	linediff.Hunk
	theirs bool
}

// touches says whether hunk h and the region [lo, hi) must be decided
// together: their base ranges overlap, or one is an insertion at or inside
// the other's edges (the order of the two edits would be a guess).
func touches(lo, hi int, h linediff.Hunk) bool {
	if h.A0 < hi && lo < h.A1 {
		return true
	}
	if h.A0 == h.A1 || lo == hi {
		return h.A0 <= hi && lo <= h.A1
	}
	return false
}

func mergeLines(base, ours, theirs []string, favor Favor) ([]string, int) {
	var all []sided
	for _, h := range linediff.Hunks(base, ours) {
		all = append(all, sided{h, false})
	}
	for _, h := range linediff.Hunks(base, theirs) {
		all = append(all, sided{h, true})
	}
	// Stable by base start: equal starts keep ours before theirs, so the
	// grouping does not depend on which side is called ours.
	slices.SortStableFunc(all, func(a, b sided) int { return a.A0 - b.A0 })

	var out []string
	conflicts, pos := 0, 0
	for i := 0; i < len(all); {
		lo, hi := all[i].A0, all[i].A1
		j := i + 1
		for j < len(all) && touches(lo, hi, all[j].Hunk) {
			hi = max(hi, all[j].A1)
			j++
		}
		var oh, th []linediff.Hunk
		for _, h := range all[i:j] {
			if h.theirs {
				th = append(th, h.Hunk)
			} else {
				oh = append(oh, h.Hunk)
			}
		}
		out = append(out, base[pos:lo]...)
		os, ts := side(base, ours, oh, lo, hi), side(base, theirs, th, lo, hi)
		switch {
		case len(th) == 0:
			out = append(out, os...)
		case len(oh) == 0:
			out = append(out, ts...)
		case slices.Equal(os, ts):
			out = append(out, os...)
		case favor == FavorOurs:
			out = append(out, os...)
		case favor == FavorTheirs:
			out = append(out, ts...)
		default:
			conflicts++
			out = append(out, markerOurs)
			out = appendTerminated(out, os)
			out = append(out, markerBase)
			out = appendTerminated(out, base[lo:hi])
			out = append(out, markerSep)
			out = appendTerminated(out, ts)
			out = append(out, markerTheirs)
		}
		pos, i = hi, j
	}
	return append(out, base[pos:]...), conflicts
}

// side is one side's version of base[lo:hi]: base with that side's hunks
// (all within the region) applied.
func side(base, lines []string, hunks []linediff.Hunk, lo, hi int) []string {
	var out []string
	p := lo
	for _, h := range hunks {
		out = append(out, base[p:h.A0]...)
		out = append(out, lines[h.B0:h.B1]...)
		p = h.A1
	}
	return append(out, base[p:hi]...)
}

// appendTerminated appends lines, ending the last with a newline so that a
// marker after it starts a line of its own.
func appendTerminated(out, lines []string) []string {
	out = append(out, lines...)
	if n := len(out); n > 0 && !strings.HasSuffix(out[n-1], "\n") {
		out[n-1] += "\n"
	}
	return out
}
