package agent

import (
	"bytes"
	"errors"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// File metadata as user.e2b.* xattrs (agentapi/metadata.go). Reads are
// bounded: the name list and each value, and pairs past the limits are
// left out rather than answered.

// maxXattrList bounds the listxattr buffer (the kernel's XATTR_LIST_MAX).
const maxXattrList = 64 << 10

// readMetadata returns path's metadata without following a final symlink;
// nil when it has none or its filesystem has no user xattrs.
func readMetadata(path string) map[string]string {
	names := listXattrs(path)
	var out map[string]string
	total := 0
	val := make([]byte, agentapi.MaxMetadataBytes)
	for _, name := range names {
		k, ok := strings.CutPrefix(name, agentapi.MetadataXattrPrefix)
		if !ok || k == "" {
			continue
		}
		n, err := unix.Lgetxattr(path, name, val)
		if err != nil {
			continue // removed meanwhile, or larger than any valid value
		}
		total += len(name) + n
		if len(out) >= agentapi.MaxMetadataKeys || total > agentapi.MaxMetadataBytes {
			break
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = string(val[:n])
	}
	return out
}

func listXattrs(path string) []string {
	buf := make([]byte, 4096)
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < maxXattrList {
			buf = make([]byte, maxXattrList)
			continue
		}
		if err != nil || n <= 0 {
			return nil
		}
		var names []string
		for _, b := range bytes.Split(buf[:n], []byte{0}) {
			if len(b) > 0 {
				names = append(names, string(b))
			}
		}
		return names
	}
}

// setMetadata makes meta the metadata of the open file f: every other
// user.e2b.* xattr is removed.
func setMetadata(f *os.File, meta map[string]string) error {
	fd := int(f.Fd())
	for _, name := range fListXattrs(fd) {
		k, ok := strings.CutPrefix(name, agentapi.MetadataXattrPrefix)
		if !ok {
			continue
		}
		if _, keep := meta[k]; keep {
			continue
		}
		if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return xattrError(err, f.Name())
		}
	}
	for k, v := range meta {
		if err := unix.Fsetxattr(fd, agentapi.MetadataXattrPrefix+k, []byte(v), 0); err != nil {
			return xattrError(err, f.Name())
		}
	}
	return nil
}

func fListXattrs(fd int) []string {
	buf := make([]byte, maxXattrList)
	n, err := unix.Flistxattr(fd, buf)
	if err != nil || n <= 0 {
		return nil
	}
	var names []string
	for _, b := range bytes.Split(buf[:n], []byte{0}) {
		if len(b) > 0 {
			names = append(names, string(b))
		}
	}
	return names
}

func xattrError(err error, path string) error {
	switch {
	case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EOPNOTSUPP):
		return errs.Wrap(errs.FailedPrecondition, err, "%s: this filesystem stores no file metadata (user xattrs)", path)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.E2BIG), errors.Is(err, unix.ERANGE):
		return errs.Wrap(errs.InvalidArgument, err, "metadata: does not fit on %s", path)
	}
	return fsError(err, path)
}
