// Package fsdiff computes the file-level changes between two views of an
// overlay filesystem (a sandbox against its base, two forks of one snapshot,
// a sandbox against one of its checkpoints) from their layers: each view is
// a Tree, a stack of layers top first, and only the layers the two views do
// not share are walked. A sandbox that changed 100 files of a 1 GiB
// workspace costs 100 lookups down the stack, not a walk of the workspace.
//
// A layer is an overlay upper dir or a read-only layer dir (DirLayer), or
// an upper tar as `runsc tar rootfs-upper` writes it (TarLayer). Both use
// overlayfs' own notation, as internal/rootfs and internal/template store
// layers: a deletion is a whiteout (a character device 0/0), a replaced
// directory is opaque (xattr trusted.overlay.opaque="y").
//
// Every layer may have been written by a sandbox and is hostile: paths are
// resolved beneath the layer's root with internal/safefs (no symlink is ever
// followed, it is reported with its target), device nodes are reported as
// refused and never opened, every read is bounded (text diffs only for files
// under Options.MaxTextBytes, entry counts under Options.MaxEntries).
//
// The package owns no long-lived state: a Tree caches lookups for the
// length of one Diff and is not safe for concurrent use.
package fsdiff

import (
	"io"
	"io/fs"
)

// Type is what kind of filesystem object a node is.
type Type string

// Node types. A device node is reported, never read.
const (
	TypeFile    Type = "file"
	TypeDir     Type = "dir"
	TypeSymlink Type = "symlink"
	TypeFIFO    Type = "fifo"
	TypeSocket  Type = "socket"
	TypeDevice  Type = "device"
)

// Node is one object of a view, as the diff reports it.
type Node struct {
	Type Type `json:"type"`
	// Mode holds the permission bits and setuid, setgid and sticky (07777).
	Mode   uint32 `json:"mode"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Size   int64  `json:"size,omitempty"`
	Target string `json:"target,omitempty"` // a symlink's target, never followed
	// SHA256 is the hex digest of a regular file's content, where the diff
	// computed it (added and modified files always).
	SHA256 string `json:"sha256,omitempty"`
}

// FileMode is n's mode as an fs.FileMode (permission and special bits).
func (n Node) FileMode() fs.FileMode {
	m := fs.FileMode(n.Mode & 0o777)
	if n.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if n.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if n.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// Entry is what one layer holds at a path.
type Entry struct {
	Node
	Whiteout bool // the path is deleted in this layer and below
	Opaque   bool // a directory hiding everything below it in lower layers
}

// Layer is one overlay layer. Paths are slash-separated and relative to the
// layer's root ("a/b"; "." is the root).
type Layer interface {
	// ID names the layer; two trees that hold a layer with the same ID
	// share it (nothing beneath a shared layer is compared).
	ID() string
	// Lstat reports the entry at rel, false if the layer has none there.
	Lstat(rel string) (Entry, bool, error)
	// ReadDir lists the names in the layer's directory rel (none if rel
	// is not a directory of this layer).
	ReadDir(rel string) ([]string, error)
	// Open opens the regular file rel for reading.
	Open(rel string) (io.ReadCloser, error)
}

// hasher is a Layer that knows its files' digests without reading them
// again (a TarLayer hashed them while indexing).
type hasher interface {
	sha256(rel string) (string, bool)
}

// stamper is a Layer that can say, without reading content, whether a
// regular file is still what berth copied (Options.QuickCheck).
type stamper interface {
	// liveStamp is the stat stamp of the file rel as it is now.
	liveStamp(rel string) (string, error)
	// recordedStamp is the stamp of the original recorded on rel when
	// berth copied it there ("" = none).
	recordedStamp(rel string) (string, error)
}

// skipEntry leaves out what belongs to one container run, not to the
// workspace: gVisor's filestore for its in-sandbox overlay (as
// internal/rootfs leaves it out of captures).
func skipEntry(rel string) bool {
	return len(rel) > len(".gvisor.filestore.") && rel[:len(".gvisor.filestore.")] == ".gvisor.filestore." && !containsSlash(rel)
}

func containsSlash(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return true
		}
	}
	return false
}
