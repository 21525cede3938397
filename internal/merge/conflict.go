package merge

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/berth-dev/berth/internal/fsdiff"
)

// ConflictKind says what both sides changed incompatibly.
type ConflictKind string

// Conflict kinds.
const (
	ConflictContent ConflictKind = "content" // overlapping line edits of a text file
	ConflictBinary  ConflictKind = "binary"  // both changed a non-text file differently
	ConflictSymlink ConflictKind = "symlink" // both retargeted a symlink differently
	ConflictMode    ConflictKind = "mode"    // both changed the mode differently
	ConflictOwner   ConflictKind = "owner"   // both changed the owner differently
	ConflictDelete  ConflictKind = "delete"  // one side deleted what the other changed
	ConflictType    ConflictKind = "type"    // the sides made different kinds of object
)

// Version is one side's object at a conflicting path.
type Version struct {
	Node *fsdiff.Node `json:"node,omitempty"` // nil: absent on this side
	Text []byte       `json:"text,omitempty"` // a text file's content (under the limit)
}

// Conflict is a path the merge could not decide; it is stored by the
// daemon and resolved with Resolve. ID is stable for the same inputs.
type Conflict struct {
	ID      string       `json:"id"`
	Path    string       `json:"path"`
	Kind    ConflictKind `json:"kind"`
	Message string       `json:"message"`
	Base    Version      `json:"base"`
	Ours    Version      `json:"ours"`
	Theirs  Version      `json:"theirs"`
	// Merged is the line merge with conflict markers (content conflicts).
	Merged []byte `json:"merged,omitempty"`
	// Below are theirs' writes beneath Path (theirs made a directory
	// there), held back until the conflict is resolved for theirs.
	Below []Write `json:"below,omitempty"`
}

// conflict records a conflict at p, or settles it for the strategy's side.
func (m *merger) conflict(p string, kind ConflictKind, msg string, b, o, t *fsdiff.Node, merged []byte) error {
	switch m.st {
	case Ours:
		if m.keptOurs == nil {
			m.keptOurs = map[string]bool{}
		}
		m.keptOurs[p] = true
		return nil
	case Theirs:
		if t == nil {
			m.plan.Deletes = append(m.plan.Deletes, Delete{Path: p, Expect: o})
			return nil
		}
		if o != nil && o.Type != t.Type {
			m.plan.Deletes = append(m.plan.Deletes, Delete{Path: p, Expect: o})
		}
		w := Write{Path: p, Node: *t, Expect: o}
		if t.Type == fsdiff.TypeFile {
			w.From = SideTheirs
		}
		m.plan.Writes = append(m.plan.Writes, w)
		return nil
	}
	c := Conflict{Path: p, Kind: kind, Message: msg, Merged: merged}
	var err error
	if c.Base, err = m.version(m.in.Base, p, b); err != nil {
		return err
	}
	if c.Ours, err = m.version(m.in.Ours, p, o); err != nil {
		return err
	}
	if c.Theirs, err = m.version(m.in.Theirs, p, t); err != nil {
		return err
	}
	c.ID = conflictID(c)
	m.plan.Conflicts = append(m.plan.Conflicts, c)
	return nil
}

func (m *merger) version(t *fsdiff.Tree, p string, n *fsdiff.Node) (Version, error) {
	if n == nil {
		return Version{}, nil
	}
	v := Version{Node: n}
	if n.Type == fsdiff.TypeFile {
		if n.SHA256 == "" {
			h, err := t.Hash(p)
			if err != nil {
				return v, err
			}
			v.Node.SHA256 = h
		}
		text, ok, err := m.text(t, p)
		if err != nil {
			return v, err
		}
		if ok {
			v.Text = text
		}
	}
	return v, nil
}

// conflictID names a conflict by what it is about, so that planning the
// same merge again gives the same id.
func conflictID(c Conflict) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", c.Path, c.Kind)
	for _, v := range []Version{c.Base, c.Ours, c.Theirs} {
		if v.Node == nil {
			h.Write([]byte("-\x00"))
			continue
		}
		fmt.Fprintf(h, "%s:%o:%d:%d:%s:%s\x00", v.Node.Type, v.Node.Mode, v.Node.UID, v.Node.GID, v.Node.Target, v.Node.SHA256)
	}
	return "c" + hex.EncodeToString(h.Sum(nil))[:15]
}
