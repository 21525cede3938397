package fsdiff

import (
	"fmt"
	"io"
	"strings"
)

// WriteStat writes a `git diff --stat`-like summary: one line per change
// (kind, lines added/removed or binary sizes, what else changed) and a
// totals line.
func (r *Result) WriteStat(w io.Writer) error {
	width := 0
	for _, c := range r.Changes {
		width = max(width, len(c.Path))
	}
	for _, c := range r.Changes {
		if _, err := fmt.Fprintf(w, " %-*s | %s\n", width, c.Path, describe(c)); err != nil {
			return err
		}
	}
	s := r.Stat
	_, err := fmt.Fprintf(w, " %d paths changed (%d added, %d deleted, %d modified), %d insertions(+), %d deletions(-)\n",
		s.Files, s.Added, s.Deleted, s.Modified, s.LinesAdded, s.LinesRemoved)
	return err
}

func describe(c Change) string {
	var parts []string
	parts = append(parts, string(c.Kind))
	switch {
	case c.Refused != "":
		parts = append(parts, "refused ("+c.Refused+")")
	case c.Binary:
		parts = append(parts, fmt.Sprintf("binary %s -> %s", sizeOf(c.Old), sizeOf(c.New)))
	case c.LinesAdded+c.LinesRemoved > 0:
		parts = append(parts, fmt.Sprintf("+%d -%d", c.LinesAdded, c.LinesRemoved))
	}
	if c.TypeChanged {
		parts = append(parts, fmt.Sprintf("type %s -> %s", c.Old.Type, c.New.Type))
	}
	if c.ModeChanged {
		parts = append(parts, fmt.Sprintf("mode %04o -> %04o", c.Old.Mode, c.New.Mode))
	}
	if c.OwnerChanged {
		parts = append(parts, fmt.Sprintf("owner %d:%d -> %d:%d", c.Old.UID, c.Old.GID, c.New.UID, c.New.GID))
	}
	n := c.New
	if n == nil {
		n = c.Old
	}
	if n.Type == TypeSymlink {
		parts = append(parts, "symlink -> "+n.Target)
	} else if n.Type != TypeFile {
		parts = append(parts, string(n.Type))
	}
	if c.RenamedFrom != "" {
		parts = append(parts, "renamed from "+c.RenamedFrom)
	}
	if c.RenamedTo != "" {
		parts = append(parts, "renamed to "+c.RenamedTo)
	}
	return strings.Join(parts, ", ")
}

func sizeOf(n *Node) string {
	if n == nil || n.Type != TypeFile {
		return "-"
	}
	return fmt.Sprintf("%d bytes", n.Size)
}

// WritePatch writes every change as a unified diff (text files) or a
// one-line description with sizes and digests (everything else).
func (r *Result) WritePatch(w io.Writer) error {
	for _, c := range r.Changes {
		var err error
		switch {
		case c.Unified != "":
			_, err = io.WriteString(w, c.Unified)
		case c.Binary:
			_, err = fmt.Fprintf(w, "Binary %s %s: %s (%s) -> %s (%s)\n", c.Path, c.Kind, sizeOf(c.Old), digest(c.Old), sizeOf(c.New), digest(c.New))
		default:
			_, err = fmt.Fprintf(w, "%s: %s\n", c.Path, describe(c))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func digest(n *Node) string {
	if n == nil || n.SHA256 == "" {
		return "-"
	}
	return "sha256:" + n.SHA256[:min(16, len(n.SHA256))]
}
