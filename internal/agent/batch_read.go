package agent

import (
	"archive/tar"
	"bufio"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// handleReadBatch streams the tree beneath a directory as a tar: regular
// files, directories, and symbolic links as links (never followed); FIFOs,
// sockets and devices are left out. Every entry is opened from its parent's
// descriptor with O_NOFOLLOW. Past the batch limits, or when a file changes
// under the walk, the stream is cut (not ended with a tar trailer), so a
// client can never take a partial tree for a whole one.
func (a *Agent) handleReadBatch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	acct, _, err := a.account(q.Get("user"))
	if err != nil {
		writeError(w, err)
		return
	}
	root := resolvePath(acct, q.Get("path"))
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			writeError(w, errs.Field("path", "%s is not a directory (GET /files reads one file)", root))
			return
		}
		writeError(w, fsError(err, root))
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	// One socket write per batchWriteBuffer, not per tar header and 4 KiB
	// of file (net/http's buffer): under gVisor each is a host round trip.
	bw := bufio.NewWriterSize(w, batchWriteBuffer)
	t := &treeWriter{tw: tar.NewWriter(bw)}
	err = t.walk(fd, "")
	if err == nil {
		err = t.tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		a.log.Debug("read batch: stream cut", "path", root, "err", err)
		panic(http.ErrAbortHandler) // cut the response: no trailer, no clean end
	}
}

const batchWriteBuffer = 256 << 10

type treeWriter struct {
	tw      *tar.Writer
	entries int
	bytes   int64
}

// walk writes the entries of the open directory fd (rel beneath the root;
// fd is closed on return) in name order.
func (t *treeWriter) walk(fd int, rel string) error {
	d := os.NewFile(uintptr(fd), rel)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		child := name
		if rel != "" {
			child = rel + "/" + name
		}
		if len(child) > agentapi.MaxBatchPathBytes {
			return errs.Field("path", "%s: name longer than %d bytes", child, agentapi.MaxBatchPathBytes)
		}
		if t.entries++; t.entries > agentapi.MaxBatchEntries {
			return errs.Field("path", "more than %d entries", agentapi.MaxBatchEntries)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed since the listing
			}
			return err
		}
		h := &tar.Header{Name: child, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
			ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec), Format: tar.FormatPAX}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			h.Typeflag, h.Name = tar.TypeDir, child+"/"
			cfd, err := openDirBeneath(fd, name, &st)
			if err != nil {
				return err // swapped since the stat: cut
			}
			if err := t.tw.WriteHeader(h); err != nil {
				_ = unix.Close(cfd)
				return err
			}
			if err := t.walk(cfd, child); err != nil {
				return err
			}
		case unix.S_IFLNK:
			buf := make([]byte, 4096)
			n, err := unix.Readlinkat(fd, name, buf)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, string(buf[:n])
			if err := t.tw.WriteHeader(h); err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := t.file(fd, name, h, &st); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t *treeWriter) file(dfd int, name string, h *tar.Header, lst *unix.Stat_t) error {
	// O_NONBLOCK: a FIFO swapped in after the stat must not hang the walk.
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), h.Name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Dev != lst.Dev || st.Ino != lst.Ino {
		return errs.Field("path", "%s changed during the walk", h.Name)
	}
	h.Typeflag, h.Size = tar.TypeReg, st.Size
	if t.bytes += st.Size; t.bytes > agentapi.MaxBatchBytes {
		return errs.Field("path", "more than %d bytes of files", int64(agentapi.MaxBatchBytes))
	}
	if err := t.tw.WriteHeader(h); err != nil {
		return err
	}
	// A file that shrinks under the copy fails here; one that grows is cut
	// at the size in its header.
	_, err = io.CopyN(t.tw, f, st.Size)
	return err
}
