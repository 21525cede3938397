package merges

import (
	"strings"

	"github.com/berth-dev/berth/internal/merge"
)

// private are the trees a merge never carries between sandboxes: the
// agent's own state in each sandbox (restore counters, its files) and the
// staging dirs of merges.
func private(p string) bool {
	return p == "var/lib/berth-agent" || strings.HasPrefix(p, "var/lib/berth-agent/") ||
		strings.HasPrefix(p, ".berth-merge-")
}

// withoutPrivate drops from a plan every write, delete and conflict on a
// private path: each sandbox keeps its own.
func withoutPrivate(p *merge.Plan) *merge.Plan {
	out := *p
	out.Writes, out.Deletes, out.Conflicts = nil, nil, nil
	for _, w := range p.Writes {
		if !private(w.Path) {
			out.Writes = append(out.Writes, w)
		}
	}
	for _, d := range p.Deletes {
		if !private(d.Path) {
			out.Deletes = append(out.Deletes, d)
		}
	}
	for _, c := range p.Conflicts {
		if !private(c.Path) {
			out.Conflicts = append(out.Conflicts, c)
		}
	}
	return &out
}
