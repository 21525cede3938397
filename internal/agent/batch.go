package agent

import (
	"archive/tar"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// A batch is many files in one request: a tar body whose entries are written
// beneath one directory, with one durability barrier (syncfs) for all of
// them instead of a file fsync and a directory fsync per file — the cost of
// small files is that barrier, and through gVisor's gofer every fsync is a
// round trip to the host.
//
// The target directory is resolved like the single-file API (the caller
// named it); every entry beneath it is resolved one component at a time
// with O_NOFOLLOW from the directory's own descriptor, so a symbolic link the
// sandbox planted (or swapped in mid-batch) is refused, never followed, and a
// final link is replaced by the new file (renameat), not written through.

// maxOpenBatchDirs bounds the directory descriptors a batch keeps open.
const maxOpenBatchDirs = 256

type batchWriter struct {
	root  string // absolute path of the target directory
	acct  account
	meta  map[string]string
	rootf *os.File
	dirs  map[string]int // relative dir ("" = root) → open descriptor
	cur   string         // the entry being written, for errors
	devOf map[int]uint64 // open descriptor → its filesystem
	syncs map[uint64]int // every filesystem a file was written to → a descriptor on it to syncfs
	res   agentapi.BatchResult
}

func (a *Agent) handleWriteBatch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	acct, _, err := a.account(q.Get("user"))
	if err != nil {
		writeError(w, err)
		return
	}
	if q.Get("path") == "" {
		writeError(w, errs.Field("path", "required: the directory the entries are written beneath"))
		return
	}
	var meta map[string]string
	if s, ok := q["metadata"]; ok {
		if meta, err = agentapi.DecodeMetadata(s[0]); err != nil {
			writeError(w, err)
			return
		}
	}
	root := resolvePath(acct, q.Get("path"))
	if err := mkdirAllOwned(root, acct); err != nil {
		writeError(w, err)
		return
	}
	rootf, err := os.OpenFile(root, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		writeError(w, fsError(err, root))
		return
	}
	var rst unix.Stat_t
	if err := unix.Fstat(int(rootf.Fd()), &rst); err != nil {
		rootf.Close()
		writeError(w, fsError(err, root))
		return
	}
	b := &batchWriter{root: root, acct: acct, meta: meta, rootf: rootf, dirs: map[string]int{"": int(rootf.Fd())},
		devOf: map[int]uint64{int(rootf.Fd()): rst.Dev}, syncs: map[uint64]int{}}
	defer b.close()
	b.res = agentapi.BatchResult{Dir: root, Entries: []agentapi.BatchEntry{}}
	start := time.Now()
	err = b.run(tar.NewReader(r.Body))
	synced := time.Now()
	b.res.WriteMS = ms(synced.Sub(start))
	if b.res.Files > 0 || b.res.Dirs > 0 {
		a.lastWrite.Store(time.Now().UnixNano())
	}
	if err != nil {
		// What was written before the failing entry stays (not rolled back).
		writeError(w, err)
		return
	}
	// The one barrier: contents, inodes and names of the whole batch — one
	// syncfs per filesystem written to (a mount beneath the root is another).
	for _, fd := range b.syncs {
		if err := unix.Syncfs(fd); err != nil {
			writeError(w, fsError(err, root))
			return
		}
	}
	b.res.Durable = "syncfs"
	b.res.SyncMS = ms(time.Since(synced))
	writeJSON(w, http.StatusOK, b.res)
}

func (b *batchWriter) close() {
	for rel, fd := range b.dirs {
		if rel != "" {
			_ = unix.Close(fd)
		}
	}
	for _, fd := range b.syncs {
		_ = unix.Close(fd)
	}
	_ = b.rootf.Close()
}

func (b *batchWriter) run(tr *tar.Reader) error {
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, err, "tar body after %d entries", n)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		if n++; n > agentapi.MaxBatchEntries {
			return errs.Field("entry", "%q: more than %d entries in one batch", h.Name, agentapi.MaxBatchEntries)
		}
		if err := agentapi.CheckBatchName(h.Name); err != nil {
			return err
		}
		name := strings.TrimSuffix(h.Name, "/")
		b.cur = name
		switch h.Typeflag {
		case tar.TypeDir:
			if _, err := b.dir(name, os.FileMode(h.Mode).Perm()); err != nil {
				return err
			}
			b.res.Dirs++
			b.res.Entries = append(b.res.Entries, agentapi.BatchEntry{Path: filepath.Join(b.root, name), Name: path.Base(name), Type: "dir"})
		case tar.TypeReg:
			if h.Size < 0 || b.res.Bytes+h.Size > agentapi.MaxBatchBytes {
				return errs.Field("entry", "%q: the batch's files exceed %d bytes", name, int64(agentapi.MaxBatchBytes))
			}
			size, err := b.file(name, os.FileMode(h.Mode).Perm(), tr)
			if err != nil {
				return err
			}
			b.res.Files++
			b.res.Bytes += size
			b.res.Entries = append(b.res.Entries, agentapi.BatchEntry{Path: filepath.Join(b.root, name), Name: path.Base(name), Type: "file", Size: size})
		default:
			return errs.Field("entry", "%q: type %q refused (a batch holds regular files and directories only)", name, string(h.Typeflag))
		}
	}
}

// dir returns a descriptor of the directory rel beneath the root, creating
// missing components (owned by the user, mode perm or 0755 for the last,
// 0755 for parents) and refusing any component that is not a directory —
// a symbolic link included.
func (b *batchWriter) dir(rel string, perm os.FileMode) (int, error) {
	if fd, ok := b.dirs[rel]; ok {
		return fd, nil
	}
	parent, base := "", rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		parent, base = rel[:i], rel[i+1:]
	}
	pfd, err := b.dir(parent, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	created := false
	if errors.Is(err, unix.ENOENT) {
		if perm == 0 {
			perm = 0o755
		}
		if err = unix.Mkdirat(pfd, base, uint32(perm)); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, b.entryError(err, rel)
		}
		created = err == nil
		err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return -1, b.entryError(err, rel)
	}
	fd, err := openDirBeneath(pfd, base, &st)
	if err != nil {
		return -1, b.entryError(err, rel)
	}
	if created {
		if err := b.touch(pfd, rel); err != nil {
			_ = unix.Close(fd)
			return -1, err
		}
		// fchown/fchmod on the descriptor: the directory we made, not
		// whatever the name points at by now.
		if err = unix.Fchown(fd, b.acct.UID, b.acct.GID); err == nil {
			err = unix.Fchmod(fd, uint32(perm))
		}
		if err != nil {
			_ = unix.Close(fd)
			return -1, b.entryError(err, rel)
		}
	}
	if len(b.dirs) >= maxOpenBatchDirs {
		b.dropDirs()
	}
	b.dirs[rel] = fd
	b.devOf[fd] = st.Dev
	return fd, nil
}

// dropDirs closes every cached descriptor but the root's.
func (b *batchWriter) dropDirs() {
	for rel, fd := range b.dirs {
		if rel != "" {
			_ = unix.Close(fd)
			delete(b.dirs, rel)
			delete(b.devOf, fd)
		}
	}
}

// file writes body to a new file beside rel and renames it over rel: readers
// never see half a file, and a symbolic link at rel is replaced, not
// followed. The name of the temporary says whether rel existed (see
// replaceFile: the watcher reports a create or a write from it).
func (b *batchWriter) file(rel string, perm os.FileMode, body io.Reader) (int64, error) {
	parent, base := "", rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		parent, base = rel[:i], rel[i+1:]
	}
	dfd, err := b.dir(parent, 0)
	if err != nil {
		return 0, err
	}
	kind := "n"
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return 0, errs.Field("entry", "%q is a directory in the sandbox", rel)
		}
		kind = "e"
		if perm == 0 && st.Mode&unix.S_IFMT == unix.S_IFREG {
			perm = os.FileMode(st.Mode & 0o777) // mode 0: keep the replaced file's, as PUT /files does
		}
	}
	if perm == 0 {
		perm = 0o644
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := "." + base + ".berth-" + kind + hex.EncodeToString(rnd[:])
	if len(tmp) > agentapi.MaxBatchNameBytes {
		tmp = ".berth-" + kind + hex.EncodeToString(rnd[:])
	}
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, b.entryError(err, rel)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(b.root, rel))
	done := false
	defer func() {
		if !done {
			_ = f.Close()
			_ = unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	n, err := io.Copy(f, body)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return 0, b.entryError(err, rel)
		}
		return 0, errs.Wrap(errs.InvalidArgument, err, "tar body: entry %q", rel)
	}
	if err := unix.Fchown(fd, b.acct.UID, b.acct.GID); err != nil {
		return 0, b.entryError(err, rel)
	}
	// After the chown, which clears set-id bits.
	if err := unix.Fchmod(fd, uint32(perm)); err != nil {
		return 0, b.entryError(err, rel)
	}
	if b.meta != nil {
		if err := setMetadata(f, b.meta); err != nil {
			return 0, err
		}
	}
	if err := f.Close(); err != nil {
		return 0, b.entryError(err, rel)
	}
	if err := unix.Renameat(dfd, tmp, dfd, base); err != nil {
		return 0, b.entryError(err, rel)
	}
	done = true
	return n, b.touch(dfd, rel)
}

// touch records that the filesystem of the open directory fd was written to.
func (b *batchWriter) touch(fd int, rel string) error {
	dev := b.devOf[fd]
	if _, ok := b.syncs[dev]; ok {
		return nil
	}
	sfd, err := unix.Dup(fd)
	if err != nil {
		return b.entryError(err, rel)
	}
	b.syncs[dev] = sfd
	return nil
}

// openDirBeneath opens the directory name beneath pfd, which lstat
// described as st, and checks that the descriptor is that same inode.
// O_NOFOLLOW alone is not enough: under gVisor, openat with
// O_DIRECTORY|O_NOFOLLOW follows a final symbolic link (see also api.go;
// this package's e2e attack test caught it writing /etc/passwd), and the
// lstat-then-open window lets a directory be swapped for a link between the
// two calls. The identity check closes both.
func openDirBeneath(pfd int, name string, st *unix.Stat_t) (int, error) {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return -1, unix.ELOOP
		}
		return -1, unix.ENOTDIR
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := sameInode(fd, st); err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// sameInode reports ELOOP when the open fd is not the inode st described
// (the name was swapped, for a link or anything else, between the two).
func sameInode(fd int, st *unix.Stat_t) error {
	var got unix.Stat_t
	if err := unix.Fstat(fd, &got); err != nil {
		return err
	}
	if got.Dev != st.Dev || got.Ino != st.Ino {
		return unix.ELOOP
	}
	return nil
}

// entryError classifies err met at rel (the entry or one of its parents),
// naming the entry; a link or a non-directory on the way is the caller's to
// fix.
func (b *batchWriter) entryError(err error, rel string) error {
	full := filepath.Join(b.root, rel)
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		return errs.Wrap(errs.InvalidArgument, err, "entry %q: %s is a symbolic link or not a directory (batch entries never follow links)", b.cur, full)
	case errors.Is(err, unix.EISDIR):
		return errs.Wrap(errs.InvalidArgument, err, "entry %q: %s is a directory", b.cur, full)
	}
	return errs.Wrap(errs.KindOf(fsError(err, full)), fsError(err, full), "entry %q", b.cur)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
