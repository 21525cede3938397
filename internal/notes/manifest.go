package notes

import (
	"fmt"
	"sort"
)

// Manifest is what a sandbox's own layers (its upper, and a fork's or a
// rewound sandbox's captured layers above the template) held when a note
// was written: one entry per path that differs from the template. Two
// manifests of one lineage are comparable because both are relative to
// the same template, whatever layer stack the sandbox runs on.
type Manifest struct {
	Entries []Entry `json:"entries"`
	// Truncated: the walk hit its bound; paths beyond it are missing.
	Truncated bool `json:"truncated,omitempty"`
}

// Entry is one path of a manifest. Type "whiteout" marks a path deleted
// relative to the template.
type Entry struct {
	Path   string `json:"p"`
	Type   string `json:"t"`
	Size   int64  `json:"s,omitempty"`
	Sum    string `json:"h,omitempty"` // sha256 of a small regular file ("" = not hashed)
	Target string `json:"l,omitempty"` // a symlink's target (never followed)
	// Base: the template has this path (so an entry is a modification,
	// and a missing entry means "as in the template").
	Base bool `json:"b,omitempty"`
}

const whiteout = "whiteout"

func (e Entry) present() bool { return e.Type != whiteout }

// Changes lists what changed from prev to cur (prev nil: from the
// template), in path order, at most limit (limit <= 0: all), and counts
// every change by kind. It is pure: the notes' change listing.
func Changes(prev, cur *Manifest, limit int) Files {
	index := func(m *Manifest) map[string]Entry {
		out := map[string]Entry{}
		if m != nil {
			for _, e := range m.Entries {
				out[e.Path] = e
			}
		}
		return out
	}
	a, b := index(prev), index(cur)
	paths := make([]string, 0, len(a)+len(b))
	for p := range a {
		paths = append(paths, p)
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	var f Files
	for _, p := range paths {
		ea, oka := a[p]
		eb, okb := b[p]
		// A path missing from a manifest is as in the template, which the
		// other entry's Base describes.
		base := ea.Base || eb.Base
		wasThere, isThere := base, base
		if oka {
			wasThere = ea.present()
		}
		if okb {
			isThere = eb.present()
		}
		c := FileChange{Path: p}
		switch {
		case !wasThere && !isThere:
			continue
		case !wasThere:
			c.Kind, c.Type, c.Size = "added", eb.Type, eb.Size
			if !okb { // back to the template's (after a restore)
				c.Type = ""
			}
		case !isThere:
			c.Kind, c.Type, c.OldSize = "deleted", ea.Type, ea.Size
			if !oka || ea.Type == whiteout {
				c.Type = ""
			}
		default:
			if oka && okb && same(ea, eb) {
				continue
			}
			if !oka && !okb {
				continue
			}
			c.Kind = "modified"
			if okb {
				c.Type, c.Size = eb.Type, eb.Size
			}
			if oka {
				c.OldSize = ea.Size
			}
		}
		switch c.Kind {
		case "added":
			f.Added++
		case "deleted":
			f.Deleted++
		default:
			f.Modified++
		}
		f.Total++
		if limit <= 0 || len(f.Changes) < limit {
			f.Changes = append(f.Changes, c)
		}
	}
	f.Truncated = cur != nil && cur.Truncated
	return f
}

// same says two manifest entries of a path describe the same object. A
// file one side could not hash (too large, or the note's hash budget was
// spent) compares by type and size only.
func same(a, b Entry) bool {
	if a.Type != b.Type || a.Size != b.Size || a.Target != b.Target {
		return false
	}
	if a.Sum != "" && b.Sum != "" {
		return a.Sum == b.Sum
	}
	return true
}

// CurrentDesync is the desync of a sandbox's newest note (notes newest
// first): the desync it recorded (a restore), else, when the newest note
// carries a context version other than the one of the newest note that
// describes the machine (collected from it, inherited or restored), both
// versions. It is pure.
func CurrentDesync(notes []Note) *Desync {
	if len(notes) == 0 {
		return nil
	}
	latest := notes[0]
	if latest.Desync != nil {
		return latest.Desync
	}
	for _, n := range notes {
		if !n.describesMachine() {
			continue
		}
		if n.Seq == latest.Seq {
			return nil
		}
		return desyncOf(latest.ContextVersion, n.ContextVersion)
	}
	return nil
}

func (n Note) describesMachine() bool { return n.Collected || n.Inherited != nil || n.Restored != nil }

// RestoreDesync is the desync of restoring a machine to the state point
// described (nil: no note at or before the point) while the agent had
// last declared the version in latest (the newest note before the restore).
func RestoreDesync(point, latest *Note) *Desync {
	if latest == nil {
		return nil
	}
	machine := ""
	if point != nil {
		if point.Seq == latest.Seq && point.Sandbox == latest.Sandbox {
			return nil
		}
		machine = point.ContextVersion
	}
	return desyncOf(latest.ContextVersion, machine)
}

func desyncOf(agent, machine string) *Desync {
	if agent == "" || agent == machine {
		return nil
	}
	m := machine
	if m == "" {
		m = "(none declared)"
	}
	return &Desync{AgentVersion: agent, MachineVersion: machine,
		Message: fmt.Sprintf("the agent's model context is at version %s but the machine holds the state of version %s: the machine was rolled back (or resumed) under it", agent, m)}
}
