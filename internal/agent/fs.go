package agent

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"syscall"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "dir"
	case m.IsRegular():
		return "file"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	default:
		return ""
	}
}

// permissions renders a mode the way ls -l does, e.g. "-rw-r--r--".
func permissions(m fs.FileMode) string {
	b := []byte("----------")
	switch {
	case m.IsDir():
		b[0] = 'd'
	case m&fs.ModeSymlink != 0:
		b[0] = 'l'
	case m&fs.ModeNamedPipe != 0:
		b[0] = 'p'
	case m&fs.ModeSocket != 0:
		b[0] = 's'
	case m&fs.ModeCharDevice != 0:
		b[0] = 'c'
	case m&fs.ModeDevice != 0:
		b[0] = 'b'
	}
	const rwx = "rwxrwxrwx"
	for i := range 9 {
		if m&(1<<uint(8-i)) != 0 {
			b[i+1] = rwx[i]
		}
	}
	special := func(bit fs.FileMode, pos int, set, unset byte) {
		if m&bit != 0 {
			if b[pos] == '-' {
				b[pos] = unset
			} else {
				b[pos] = set
			}
		}
	}
	special(fs.ModeSetuid, 3, 's', 'S')
	special(fs.ModeSetgid, 6, 's', 'S')
	special(fs.ModeSticky, 9, 't', 'T')
	return string(b)
}

// entryInfo describes path without following a final symlink, except that a
// symlink's Type is its target's type ("" when dangling).
func entryInfo(db *userDB, path string) (agentapi.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return agentapi.EntryInfo{}, fsError(err, path)
	}
	info := agentapi.EntryInfo{
		Name:        filepath.Base(path),
		Type:        fileType(fi.Mode()),
		Path:        path,
		Size:        fi.Size(),
		Mode:        uint32(fi.Mode().Perm()),
		Permissions: permissions(fi.Mode()),
		ModTime:     fi.ModTime().UTC(),
	}
	info.Metadata = readMetadata(path)
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Owner = db.userName(int(st.Uid))
		info.Group = db.groupName(int(st.Gid))
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		info.Type = ""
		if tfi, err := os.Stat(path); err == nil {
			info.Type = fileType(tfi.Mode())
		}
		if resolved, err := filepath.EvalSymlinks(path); err == nil {
			info.SymlinkTarget = resolved
		} else if link, err := os.Readlink(path); err == nil {
			if !filepath.IsAbs(link) {
				link = filepath.Join(filepath.Dir(path), link)
			}
			info.SymlinkTarget = filepath.Clean(link)
		}
	}
	return info, nil
}

func (a *Agent) handleStat(w http.ResponseWriter, r *http.Request) {
	var req agentapi.PathRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	acct, db, err := a.account(req.User)
	if err != nil {
		writeError(w, err)
		return
	}
	info, err := entryInfo(db, resolvePath(acct, req.Path))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (a *Agent) handleList(w http.ResponseWriter, r *http.Request) {
	var req agentapi.ListRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Depth < 0 {
		writeError(w, errs.Field("depth", "must be >= 0, got %d", req.Depth))
		return
	}
	depth := max(req.Depth, 1)
	acct, db, err := a.account(req.User)
	if err != nil {
		writeError(w, err)
		return
	}
	root := resolvePath(acct, req.Path)
	fi, err := os.Stat(root)
	if err != nil {
		writeError(w, fsError(err, root))
		return
	}
	if !fi.IsDir() {
		writeError(w, errs.Field("path", "%s is not a directory", root))
		return
	}
	list := []agentapi.EntryInfo{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fsError(err, dir)
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			info, err := entryInfo(db, p)
			if errs.Is(err, errs.NotFound) {
				continue // removed while listing
			}
			if err != nil {
				return err
			}
			list = append(list, info)
			// e.IsDir does not follow symlinks: links are listed, not entered.
			if e.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil && !errs.Is(err, errs.NotFound) {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (a *Agent) handleMkdir(w http.ResponseWriter, r *http.Request) {
	var req agentapi.PathRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	acct, db, err := a.account(req.User)
	if err != nil {
		writeError(w, err)
		return
	}
	path := resolvePath(acct, req.Path)
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			writeError(w, errs.E(errs.AlreadyExists, "%s already exists", path))
		} else {
			writeError(w, errs.Field("path", "%s exists and is not a directory", path))
		}
		return
	}
	if err := mkdirAllOwned(path, acct); err != nil {
		writeError(w, err)
		return
	}
	info, err := entryInfo(db, path)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (a *Agent) handleMove(w http.ResponseWriter, r *http.Request) {
	var req agentapi.MoveRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Source == "" || req.Destination == "" {
		writeError(w, errs.Field("source", "source and destination are required"))
		return
	}
	acct, db, err := a.account(req.User)
	if err != nil {
		writeError(w, err)
		return
	}
	src, dst := resolvePath(acct, req.Source), resolvePath(acct, req.Destination)
	if _, err := os.Lstat(src); err != nil {
		writeError(w, fsError(err, src))
		return
	}
	if err := mkdirAllOwned(filepath.Dir(dst), acct); err != nil {
		writeError(w, err)
		return
	}
	if err := os.Rename(src, dst); err != nil {
		if errors.Is(err, syscall.EXDEV) {
			writeError(w, errs.Wrap(errs.FailedPrecondition, err, "move %s across filesystems", src))
			return
		}
		writeError(w, fsError(err, dst))
		return
	}
	info, err := entryInfo(db, dst)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (a *Agent) handleRemove(w http.ResponseWriter, r *http.Request) {
	var req agentapi.PathRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	acct, _, err := a.account(req.User)
	if err != nil {
		writeError(w, err)
		return
	}
	path := resolvePath(acct, req.Path)
	if path == "/" {
		writeError(w, errs.Field("path", "refusing to remove /"))
		return
	}
	if err := os.RemoveAll(path); err != nil {
		writeError(w, fsError(err, path))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
