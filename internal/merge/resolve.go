package merge

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
)

// Resolution settles one conflict: by a side (the path becomes that side's
// version, whole) or by content (the path becomes a regular file with
// Content, mode Mode or else ours' mode, or theirs' if ours has none).
type Resolution struct {
	Side    Side    `json:"side,omitempty"`
	Content []byte  `json:"content,omitempty"`
	Mode    *uint32 `json:"mode,omitempty"`
}

// Resolve settles the conflict id of p: it leaves the plan's conflicts and
// becomes writes/deletes of the same shape as the plan's own. It is pure:
// the daemon stores the updated plan and applies it when it is clean.
func (p *Plan) Resolve(id string, r Resolution) error {
	i := -1
	for k, c := range p.Conflicts {
		if c.ID == id {
			i = k
		}
	}
	if i < 0 {
		return errs.E(errs.NotFound, "no conflict %q in this merge", id)
	}
	c := p.Conflicts[i]
	var ds []Delete
	var ws []Write
	expect := c.Ours.Node
	switch {
	case r.Side != "" && r.Content != nil:
		return errs.Field("resolution", "give a side or content, not both")
	case r.Content != nil:
		base := c.Ours.Node
		if base == nil || base.Type != fsdiff.TypeFile {
			base = c.Theirs.Node
		}
		n := fsdiff.Node{Type: fsdiff.TypeFile, Mode: 0o644}
		if base != nil && base.Type == fsdiff.TypeFile {
			n.Mode, n.UID, n.GID = base.Mode, base.UID, base.GID
		}
		if r.Mode != nil {
			if *r.Mode&^0o7777 != 0 {
				return errs.Field("mode", "mode %o has bits outside 07777", *r.Mode)
			}
			n.Mode = *r.Mode
		}
		sum := sha256.Sum256(r.Content)
		n.Size, n.SHA256 = int64(len(r.Content)), hex.EncodeToString(sum[:])
		if expect != nil && expect.Type != fsdiff.TypeFile {
			ds = append(ds, Delete{Path: c.Path, Expect: expect})
		}
		ws = append(ws, Write{Path: c.Path, Node: n, Content: r.Content, Expect: expect})
	case r.Side == SideOurs:
		// The target keeps what it has.
	case r.Side == SideTheirs || r.Side == SideBase:
		v := c.Theirs
		if r.Side == SideBase {
			v = c.Base
		}
		if v.Node == nil {
			if expect != nil {
				ds = append(ds, Delete{Path: c.Path, Expect: expect})
			}
			break
		}
		if expect != nil && expect.Type != v.Node.Type {
			ds = append(ds, Delete{Path: c.Path, Expect: expect})
		}
		w := Write{Path: c.Path, Node: *v.Node, Expect: expect}
		if v.Node.Type == fsdiff.TypeFile {
			if v.Text != nil {
				w.Content = v.Text
			} else {
				w.From = r.Side
			}
		}
		ws = append(ws, w)
		if r.Side == SideTheirs {
			ws = append(ws, c.Below...)
		}
	default:
		return errs.Field("side", "unknown side %q (want ours, theirs or base)", r.Side)
	}
	p.Conflicts = append(p.Conflicts[:i:i], p.Conflicts[i+1:]...)
	p.Deletes = append(p.Deletes, ds...)
	p.Writes = append(p.Writes, ws...)
	m := merger{plan: p}
	m.finish()
	return nil
}
