package timeline

import (
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/store"
)

// The timeline's decisions as pure functions (plan_test.go).

// Checkpoint modes: what a checkpoint holds.
const (
	ModeMemory = "memory" // files and a memory image
	ModeFiles  = "files"  // files only
)

var nameRe = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// validName checks a checkpoint name: 1-63 chars of lowercase letters,
// digits, '.', '_', '-', not all digits (a number names a seq).
func validName(name string) error {
	if !nameRe.MatchString(name) {
		return errs.Field("name", "checkpoint names are 1-63 chars of lowercase letters, digits, '.', '_', '-', got %q", name)
	}
	if _, err := strconv.Atoi(name); err == nil {
		return errs.Field("name", "a checkpoint name may not be a number (numbers name a checkpoint's seq), got %q", name)
	}
	return nil
}

// deltaBase is the view a new checkpoint is a delta against: the
// timeline head's when the sandbox still runs on a stack it tops (a
// checkpoint since its last boot, or the checkpoint it was rewound to),
// else the layers it boots on (no checkpoint yet, or it was restarted on
// other layers since: a promote). prev names the head's checkpoint.
func deltaBase(head *store.TimelineHead, boot []string) (base []string, prev string) {
	if head != nil && len(head.Layers) >= len(boot) && slices.Equal(head.Layers[len(head.Layers)-len(boot):], boot) {
		return slices.Clone(head.Layers), head.Checkpoint
	}
	return slices.Clone(boot), ""
}

// resolve finds checkpoint ref of a sandbox's timeline: its id, its name
// or its seq (a number, or "#n"). field names the request field.
func resolve(list []store.Checkpoint, ref, field string) (store.Checkpoint, error) {
	if ref == "" {
		return store.Checkpoint{}, errs.Field(field, "name a checkpoint (id, name or seq; see `berth timeline`)")
	}
	seq, seqErr := strconv.ParseInt(strings.TrimPrefix(ref, "#"), 10, 64)
	for _, c := range list {
		if c.ID == ref || (c.Name != "" && c.Name == ref) || (seqErr == nil && c.Seq == seq) {
			return c, nil
		}
	}
	return store.Checkpoint{}, errs.E(errs.NotFound, "checkpoint %q not found on this sandbox's timeline (see `berth timeline`)", ref)
}

// rewindMode says whether a rewind to c restores its memory image on
// runtime rt (imageOK: the image is on disk), and why not.
func rewindMode(c store.Checkpoint, rt string, imageOK bool) (memory bool, reason string) {
	switch {
	case c.MemoryPath == "":
		return false, ""
	case c.Runtime != rt:
		return false, "the memory image was taken on " + c.Runtime + ", the sandbox runs on " + rt
	case !imageOK:
		return false, "the memory image is missing"
	}
	return true, ""
}

// layerRefs is every reference to layers outside the one being dropped.
type layerRefs struct {
	templates, snapshots, sandboxes, checkpoints, heads [][]string
}

// used reports whether any reference names layer dg.
func (r layerRefs) used(dg string) bool {
	for _, group := range [][][]string{r.templates, r.snapshots, r.sandboxes, r.checkpoints, r.heads} {
		for _, ls := range group {
			if slices.Contains(ls, dg) {
				return true
			}
		}
	}
	return false
}

// children are the ids of parent's live fork children other than keep.
func otherChildren(parent, keep string, all []childRef) []string {
	var out []string
	for _, c := range all {
		if c.parent == parent && c.id != keep && !c.deleted {
			out = append(out, c.id)
		}
	}
	return out
}

type childRef struct {
	id, parent string
	deleted    bool
}

// promoteLayers is the stack a promoted parent runs on: the child's
// captured upper over the child's layers, with an adjacent duplicate
// collapsed (an empty upper over an empty fork snapshot digest alike:
// [X, X, ...] shows what [X, ...] shows, and overlayfs refuses a lower
// twice).
func promoteLayers(captured string, child []string) []string {
	if len(child) > 0 && child[0] == captured {
		return slices.Clone(child)
	}
	return append([]string{captured}, child...)
}
