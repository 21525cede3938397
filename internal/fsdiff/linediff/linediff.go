// Package linediff computes line-level differences between two texts with
// Myers' O((N+M)·D) algorithm, and renders them as unified diffs. It is the
// line engine under internal/fsdiff (text diffs) and internal/merge (diff3).
//
// The texts are sandbox-written, so the work is bounded: common prefix and
// suffix are trimmed first, and when the remaining edit distance exceeds
// MaxEdits the middle is reported as one replacement (a valid, if coarse,
// diff) instead of spending quadratic memory on it.
package linediff

import (
	"bytes"
	"fmt"
	"strings"
)

// MaxEdits bounds the edit distance the exact search explores; past it the
// untrimmed middle becomes a single hunk. The search keeps O(D²) integers.
const MaxEdits = 2000

// Split cuts data into lines, each keeping its "\n" (the last one may lack
// it), so that joining the lines gives data back byte for byte.
func Split(data []byte) []string {
	if len(data) == 0 {
		return nil
	}
	lines := make([]string, 0, bytes.Count(data, []byte{'\n'})+1)
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			lines = append(lines, string(data))
			break
		}
		lines = append(lines, string(data[:i+1]))
		data = data[i+1:]
	}
	return lines
}

// Hunk says that a[A0:A1] is replaced by b[B0:B1]. An empty A range is an
// insertion before a[A0]; an empty B range a deletion.
type Hunk struct{ A0, A1, B0, B1 int }

// Hunks returns the changes that turn a into b, in order, non-overlapping,
// with at least one unchanged line between two hunks.
func Hunks(a, b []string) []Hunk {
	ids := map[string]int{}
	intern := func(s []string) []int {
		out := make([]int, len(s))
		for i, l := range s {
			id, ok := ids[l]
			if !ok {
				id = len(ids)
				ids[l] = id
			}
			out[i] = id
		}
		return out
	}
	x, y := intern(a), intern(b)
	pre := 0
	for pre < len(x) && pre < len(y) && x[pre] == y[pre] {
		pre++
	}
	suf := 0
	for suf < len(x)-pre && suf < len(y)-pre && x[len(x)-1-suf] == y[len(y)-1-suf] {
		suf++
	}
	mx, my := x[pre:len(x)-suf], y[pre:len(y)-suf]
	var hunks []Hunk
	for _, h := range myers(mx, my) {
		hunks = append(hunks, Hunk{h.A0 + pre, h.A1 + pre, h.B0 + pre, h.B1 + pre})
	}
	return hunks
}

// myers finds a shortest edit script from x to y (greedy forward search
// with a trace of the frontier per distance), merged into hunks.
func myers(x, y []int) []Hunk {
	n, m := len(x), len(y)
	if n == 0 && m == 0 {
		return nil
	}
	if n == 0 || m == 0 {
		return []Hunk{{0, n, 0, m}}
	}
	limit := min(n+m, MaxEdits)
	off := limit + 1
	v := make([]int, 2*limit+3)
	var trace [][]int // trace[d] = v[-d..d] after step d
	found := -1
	for d := 0; d <= limit && found < 0; d++ {
		for k := -d; k <= d; k += 2 {
			var px int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				px = v[off+k+1] // down: insertion
			} else {
				px = v[off+k-1] + 1 // right: deletion
			}
			py := px - k
			for px < n && py < m && x[px] == y[py] {
				px, py = px+1, py+1
			}
			v[off+k] = px
			if px >= n && py >= m {
				found = d
				break
			}
		}
		snap := make([]int, 2*d+1)
		copy(snap, v[off-d:off+d+1])
		trace = append(trace, snap)
	}
	if found < 0 {
		return []Hunk{{0, n, 0, m}}
	}
	// Walk back from (n, m), collecting single-line edits in reverse.
	type edit struct {
		del  bool
		a, b int // position of the edit in x (del) or y (ins)
	}
	var edits []edit
	px, py := n, m
	for d := found; d > 0; d-- {
		prev := trace[d-1]
		at := func(k int) int { return prev[k+(d-1)] }
		k := px - py
		var pk int
		if k == -d || (k != d && at(k-1) < at(k+1)) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		sx := at(pk)
		sy := sx - pk
		// The step from (sx, sy) was one insertion of y[sy] (down) or one
		// deletion of x[sx] (right), then a diagonal run to (px, py).
		edits = append(edits, edit{del: pk != k+1, a: sx, b: sy})
		px, py = sx, sy
	}
	// Edits are in reverse order; build hunks forward.
	var hunks []Hunk
	for i := len(edits) - 1; i >= 0; i-- {
		e := edits[i]
		var h Hunk
		if e.del {
			h = Hunk{e.a, e.a + 1, e.b, e.b}
		} else {
			h = Hunk{e.a, e.a, e.b, e.b + 1}
		}
		if len(hunks) > 0 {
			last := &hunks[len(hunks)-1]
			if last.A1 == h.A0 && last.B1 == h.B0 {
				last.A1, last.B1 = h.A1, h.B1
				continue
			}
		}
		hunks = append(hunks, h)
	}
	return hunks
}

// Unified renders the hunks turning a into b as a unified diff with ctx
// lines of context, under the headers "--- aName" and "+++ bName". It
// returns "" when a and b are equal, and the counts of added and removed
// lines.
func Unified(aName, bName string, a, b []string, ctx int) (text string, added, removed int) {
	hunks := Hunks(a, b)
	if len(hunks) == 0 {
		return "", 0, 0
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", aName, bName)
	line := func(prefix string, s string) {
		sb.WriteString(prefix)
		sb.WriteString(s)
		if !strings.HasSuffix(s, "\n") {
			sb.WriteString("\n\\ No newline at end of file\n")
		}
	}
	for i := 0; i < len(hunks); {
		// Group hunks whose contexts touch.
		j := i
		for j+1 < len(hunks) && hunks[j+1].A0-hunks[j].A1 <= 2*ctx {
			j++
		}
		a0 := max(hunks[i].A0-ctx, 0)
		a1 := min(hunks[j].A1+ctx, len(a))
		b0 := hunks[i].B0 - (hunks[i].A0 - a0)
		b1 := hunks[j].B1 + (a1 - hunks[j].A1)
		fmt.Fprintf(&sb, "@@ -%s +%s @@\n", rng(a0, a1), rng(b0, b1))
		pos := a0
		for k := i; k <= j; k++ {
			h := hunks[k]
			for ; pos < h.A0; pos++ {
				line(" ", a[pos])
			}
			for p := h.A0; p < h.A1; p++ {
				line("-", a[p])
				removed++
			}
			for p := h.B0; p < h.B1; p++ {
				line("+", b[p])
				added++
			}
			pos = h.A1
		}
		for ; pos < a1; pos++ {
			line(" ", a[pos])
		}
		i = j + 1
	}
	return sb.String(), added, removed
}

// rng formats a hunk range the way diff -u does: "start,count", with the
// start 1-based, or the line before an empty range.
func rng(lo, hi int) string {
	n := hi - lo
	switch n {
	case 0:
		return fmt.Sprintf("%d,0", lo)
	case 1:
		return fmt.Sprintf("%d", lo+1)
	}
	return fmt.Sprintf("%d,%d", lo+1, n)
}
