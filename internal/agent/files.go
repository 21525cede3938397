package agent

import (
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// fsError classifies an error from the filesystem for the named path.
func fsError(err error, path string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &errs.Error{Kind: errs.ResourceExhausted, Message: "no space left on device", Err: err}
	case errors.Is(err, fs.ErrNotExist):
		return errs.Wrap(errs.NotFound, err, "%s not found", path)
	case errors.Is(err, fs.ErrExist):
		return errs.Wrap(errs.AlreadyExists, err, "%s already exists", path)
	case errors.Is(err, fs.ErrPermission):
		return errs.Wrap(errs.PermissionDenied, err, "%s", path)
	case errors.Is(err, syscall.ENOTDIR):
		return errs.Wrap(errs.InvalidArgument, err, "%s: a path component is not a directory", path)
	case errors.Is(err, syscall.EISDIR):
		return errs.Wrap(errs.InvalidArgument, err, "%s is a directory", path)
	default:
		return errs.Wrap(errs.Internal, err, "%s", path)
	}
}

func (a *Agent) handleReadFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	acct, _, err := a.account(q.Get("user"))
	if err != nil {
		writeError(w, err)
		return
	}
	path := resolvePath(acct, q.Get("path"))
	f, err := os.Open(path)
	if err != nil {
		writeError(w, fsError(err, path))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, fsError(err, path))
		return
	}
	if fi.IsDir() {
		writeError(w, errs.Field("path", "%s is a directory", path))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, f); err != nil {
		a.log.Debug("read file: client gone", "path", path, "err", err)
	}
}

// handleWriteFile streams the body into a temp file beside the target and
// renames it over, so readers never see a half-written file. Parents are
// created owned by the user; the file is chowned to the user and fsync'd.
// append=1 appends in place instead.
func (a *Agent) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	acct, db, err := a.account(q.Get("user"))
	if err != nil {
		writeError(w, err)
		return
	}
	if q.Get("path") == "" {
		writeError(w, errs.Field("path", "required"))
		return
	}
	path := resolvePath(acct, q.Get("path"))
	var mode os.FileMode
	if s := q.Get("mode"); s != "" {
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil || m > 0o7777 {
			writeError(w, errs.Field("mode", "must be octal permission bits like 0644, got %q", s))
			return
		}
		mode = os.FileMode(m)
	}
	var meta map[string]string
	if s, ok := q["metadata"]; ok {
		if meta, err = agentapi.DecodeMetadata(s[0]); err != nil {
			writeError(w, err)
			return
		}
	}
	appendMode := q.Get("append") == "1" || q.Get("append") == "true"
	// Write through a symlink at the target, as truncating would.
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		writeError(w, errs.Field("path", "%s is a directory", path))
		return
	}
	if err := mkdirAllOwned(filepath.Dir(path), acct); err != nil {
		writeError(w, err)
		return
	}
	if appendMode {
		err = appendFile(path, mode, acct, r.Body, meta)
	} else {
		err = replaceFile(path, mode, acct, r.Body, meta)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	a.lastWrite.Store(time.Now().UnixNano())
	info, err := entryInfo(db, path)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// replaceFile writes body to a new file that replaces path; with meta
// (non-nil) the new file carries that metadata, set before it takes the name.
func replaceFile(path string, mode os.FileMode, acct account, body io.Reader, meta map[string]string) error {
	fi, statErr := os.Stat(path)
	if mode == 0 {
		mode = 0o644
		if statErr == nil {
			mode = fi.Mode().Perm()
		}
	}
	// The temporary name says whether the target existed ("n": new), so a
	// watcher reports a create for a new file without racing the rename.
	kind := "n"
	if statErr == nil {
		kind = "e"
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".berth-"+kind+"*")
	if err != nil {
		return fsError(err, path)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := copyBulk(tmp, body); err != nil {
		return bodyError(err, path)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fsError(err, path)
	}
	if err := tmp.Chown(acct.UID, acct.GID); err != nil {
		return fsError(err, path)
	}
	if meta != nil {
		if err := setMetadata(tmp, meta); err != nil {
			return err
		}
	}
	if err := tmp.Sync(); err != nil {
		return fsError(err, path)
	}
	if err := tmp.Close(); err != nil {
		return fsError(err, path)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fsError(err, path)
	}
	done = true
	return syncDir(filepath.Dir(path))
}

func appendFile(path string, mode os.FileMode, acct account, body io.Reader, meta map[string]string) error {
	if mode == 0 {
		mode = 0o644
	}
	_, statErr := os.Lstat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, mode)
	if err != nil {
		return fsError(err, path)
	}
	defer f.Close()
	if errors.Is(statErr, fs.ErrNotExist) {
		if err := f.Chown(acct.UID, acct.GID); err != nil {
			return fsError(err, path)
		}
	}
	if _, err := io.Copy(f, body); err != nil {
		return bodyError(err, path)
	}
	if meta != nil {
		if err := setMetadata(f, meta); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return fsError(err, path)
	}
	return fsError(f.Close(), path)
}

// bulkWriteChunk is how much a file upload moves per read and write. Under
// gVisor every write to a file on the gofer is a round trip to the host, and
// io.Copy's 32 KiB made 2048 of them for 64 MiB.
const bulkWriteChunk = 1 << 20

var bulkBufs = sync.Pool{New: func() any { b := make([]byte, bulkWriteChunk); return &b }}

// copyBulk copies body to f in bulkWriteChunk pieces (f's own ReadFrom
// would fall back to 32 KiB: the body is no file or socket it can splice).
func copyBulk(f *os.File, body io.Reader) (int64, error) {
	bp := bulkBufs.Get().(*[]byte)
	defer bulkBufs.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{f}, body, *bp)
}

// bodyError tells a failed disk write from a failed upload.
func bodyError(err error, path string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fsError(err, path)
	}
	return errs.Wrap(errs.InvalidArgument, err, "read request body")
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fsError(err, dir)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fsError(err, dir)
	}
	return nil
}

// mkdirAllOwned creates dir and its missing parents, each chowned to acct.
// A non-directory in the way is InvalidArgument.
func mkdirAllOwned(dir string, acct account) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return errs.Field("path", "%s exists and is not a directory", dir)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		if errors.Is(err, syscall.ENOTDIR) {
			return errs.Field("path", "a component of %s is not a directory", dir)
		}
		return fsError(err, dir)
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAllOwned(parent, acct); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // created concurrently
		}
		return fsError(err, dir)
	}
	return fsError(os.Lchown(dir, acct.UID, acct.GID), dir)
}
