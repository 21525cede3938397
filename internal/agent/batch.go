package agent

import (
	"archive/tar"
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
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

// batchReadBuffer is how much of the tar body one read asks for. net/http's
// 4 KiB buffer made two or three socket reads per small entry, and under
// gVisor each is a host round trip through the sentry.
const batchReadBuffer = 1 << 20

type batchWriter struct {
	root  string // absolute path of the target directory
	acct  account
	meta  map[string]string
	rootf *os.File
	dirs  map[string]int // relative dir ("" = root) → open descriptor
	cur   string         // the entry being written, for errors
	devOf map[int]uint64 // open descriptor → its filesystem
	syncs map[uint64]int // every filesystem a file was written to → a descriptor on it to syncfs
	// fresh are the directories this batch created, each with the names
	// written in it so far (→ the mode given): nothing else can be in one
	// but what a process of the sandbox races in, which the rename replaces
	// as it would after a stat, so a file there needs no lookup first.
	fresh map[string]map[string]os.FileMode
	// umask is the agent's: a file is created with its final bits (and
	// gets no fchmod) when the umask takes none of them (file, below).
	umask uint32
	tag   string // random, per batch: temporaries' names
	seq   uint64
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
	// sync=host: the daemon takes the durability barrier of the sandbox's
	// root filesystem on the host, after this answer (one syncfs of the
	// workspace image there, instead of gVisor's fsync of every file it
	// holds open — see daemon.SyncWorkspace); other filesystems are still
	// synced here.
	hostSync := q.Get("sync") == "host"
	root := resolvePath(acct, q.Get("path"))
	_, statErr := os.Lstat(root)
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
		devOf: map[int]uint64{int(rootf.Fd()): rst.Dev}, syncs: map[uint64]int{}, fresh: map[string]map[string]os.FileMode{},
		umask: processUmask(), tag: randomTag()}
	if errors.Is(statErr, os.ErrNotExist) {
		b.fresh[""] = map[string]os.FileMode{}
	}
	defer b.close()
	b.res = agentapi.BatchResult{Dir: root, Entries: []agentapi.BatchEntry{}}
	start := time.Now()
	err = b.run(tar.NewReader(bufio.NewReaderSize(r.Body, batchReadBuffer)))
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
	var rootDev uint64
	if hostSync {
		var st unix.Stat_t
		if unix.Stat("/", &st) != nil {
			hostSync = false
		}
		rootDev = st.Dev
	}
	b.res.Durable = "syncfs"
	for dev, fd := range b.syncs {
		if hostSync && dev == rootDev {
			b.res.Durable = agentapi.DurableHost
			continue
		}
		if err := unix.Syncfs(fd); err != nil {
			writeError(w, fsError(err, root))
			return
		}
	}
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
		if created {
			b.fresh[rel] = map[string]os.FileMode{}
		}
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
	written, fresh := b.fresh[parent]
	if prev, again := written[base]; fresh && again {
		kind = "e"
		if perm == 0 {
			perm = prev
		}
	} else if !fresh {
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
	}
	if perm == 0 {
		perm = 0o644
	}
	// The batch's random tag and a counter, digits only (the watcher reads
	// the kind from a name like replaceFile's): unique without a
	// getrandom(2) per file; O_EXCL refuses a name taken anyway.
	tmpName := func() string {
		b.seq++
		suffix := ".berth-" + kind + b.tag + strconv.FormatUint(b.seq, 10)
		if tmp := "." + base + suffix; len(tmp) <= agentapi.MaxBatchNameBytes {
			return tmp
		}
		return suffix
	}
	tmp := tmpName()
	// Created with its final bits when the chown cannot clear any (it
	// clears set-id bits) and the umask takes none: then no fchmod. The
	// temporary's name is not the target's: nobody reads it as the file.
	createMode, chmod := uint32(0o600), true
	if uint32(perm)&^0o777 == 0 && uint32(perm)&b.umask == 0 {
		createMode, chmod = uint32(perm), false
	}
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, createMode)
	for try := 0; errors.Is(err, unix.EEXIST) && try < 3; try++ {
		tmp = tmpName()
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, createMode)
	}
	if err != nil {
		return 0, b.entryError(err, rel)
	}
	// The raw descriptor, not an *os.File (whose NewFile is an fcntl(2)
	// more per file, a host round trip under gVisor).
	closed, done := false, false
	defer func() {
		if !done {
			if !closed {
				_ = unix.Close(fd)
			}
			_ = unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	n, werr, rerr := copyToFD(fd, body)
	if werr != nil {
		return 0, b.entryError(werr, rel)
	}
	if rerr != nil {
		return 0, errs.Wrap(errs.InvalidArgument, rerr, "tar body: entry %q", rel)
	}
	if err := unix.Fchown(fd, b.acct.UID, b.acct.GID); err != nil {
		return 0, b.entryError(err, rel)
	}
	// After the chown, which clears set-id bits.
	if chmod {
		if err := unix.Fchmod(fd, uint32(perm)); err != nil {
			return 0, b.entryError(err, rel)
		}
	}
	if b.meta != nil {
		f := os.NewFile(uintptr(fd), filepath.Join(b.root, rel))
		err := setMetadata(f, b.meta)
		closed = true
		if cerr := f.Close(); err == nil && cerr != nil {
			err = b.entryError(cerr, rel)
		}
		if err != nil {
			return 0, err
		}
	} else {
		closed = true
		if err := unix.Close(fd); err != nil {
			return 0, b.entryError(err, rel)
		}
	}
	if err := unix.Renameat(dfd, tmp, dfd, base); err != nil {
		return 0, b.entryError(err, rel)
	}
	if fresh {
		written[base] = perm
	}
	done = true
	return n, b.touch(dfd, rel)
}

// copyToFD copies body to the file fd through one of the agent's bulk
// buffers: the write error (the disk's) apart from the read error (the
// tar's).
func copyToFD(fd int, body io.Reader) (n int64, werr, rerr error) {
	bp := bulkBufs.Get().(*[]byte)
	defer bulkBufs.Put(bp)
	buf := *bp
	for {
		m, err := body.Read(buf)
		for off := 0; off < m; {
			w, e := unix.Write(fd, buf[off:m])
			if e == unix.EINTR {
				continue
			}
			if e != nil {
				return n, e, nil
			}
			if w == 0 {
				return n, io.ErrShortWrite, nil
			}
			off += w
			n += int64(w)
		}
		if errors.Is(err, io.EOF) {
			return n, nil, nil
		}
		if err != nil {
			return n, nil, err
		}
	}
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

func randomTag() string {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	return fmt.Sprintf("%012d", binary.LittleEndian.Uint64(rnd[:])%1e12)
}

// processUmask is the agent's umask, read from /proc (umask(2) cannot read
// it without setting it, which would race the agent's other creates); the
// full mask when it cannot be read, so that every file gets its fchmod.
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0o777
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
				return uint32(m) & 0o777
			}
		}
	}
	return 0o777
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
