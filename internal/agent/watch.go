package agent

import (
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/fsnotify/fsnotify"
)

var watchOps = []struct {
	op   fsnotify.Op
	name string
}{
	{fsnotify.Create, "create"},
	{fsnotify.Write, "write"},
	{fsnotify.Remove, "remove"},
	{fsnotify.Rename, "rename"},
	{fsnotify.Chmod, "chmod"},
}

// replaceTemp matches the temporary file replaceFile writes next to its
// target (os.CreateTemp's "*" is a decimal number) and captures the
// target's base name and whether it existed then ("e") or not ("n").
var replaceTemp = regexp.MustCompile(`^\.(.+)\.berth-([ne])[0-9]+$`)

// networkFS are the statfs magic numbers of filesystems whose changes made
// elsewhere inotify does not see: a watch there needs AllowNetworkMounts.
var networkFS = map[int64]string{
	0x6969:     "nfs",
	0x517b:     "smb",
	0xff534d42: "cifs",
	0xfe534d42: "smb2",
	0x5346414f: "afs",
	0x00c36400: "ceph",
	0x65735546: "fuse",
	0x47504653: "gpfs",
	0x0bd00bd0: "lustre",
}

// networkMount names the network filesystem dir is on, or "".
func networkMount(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return ""
	}
	return networkFS[int64(st.Type)]
}

// addTree watches dir and, when recursive, every directory below it
// (symlinks are not followed).
func addTree(w *fsnotify.Watcher, dir string, recursive bool) error {
	if !recursive {
		return w.Add(dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // vanished or unreadable below the root
		}
		if d.IsDir() {
			if err := w.Add(p); err != nil && p == dir {
				return err
			}
		}
		return nil
	})
}

// maxCatchUp bounds the entries reported for one directory created under a
// recursive watch (see catchUp).
const maxCatchUp = 10000

// catchUp reports what was made inside dir, a directory just created under
// a recursive watch, before its own watch was in place (mkdir -p a/b/c &&
// echo > a/b/c/f is faster than the agent): a create for every entry below
// it and a write for every non-empty regular file. Events for entries made
// after the watch was added may then come twice, which watchers tolerate;
// missing them is what they cannot.
func catchUp(dir string, emit func(op, path string) bool) {
	n := 0
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		if n++; n > maxCatchUp {
			return filepath.SkipAll
		}
		if replaceTemp.MatchString(d.Name()) {
			return nil
		}
		if !emit("create", p) {
			return filepath.SkipAll
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil && fi.Size() > 0 && !emit("write", p) {
				return filepath.SkipAll
			}
		}
		return nil
	})
}

func (a *Agent) handleWatch(w http.ResponseWriter, r *http.Request) {
	keepalive, err := keepaliveParam(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req agentapi.WatchRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
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
	if fsName := networkMount(root); fsName != "" && !req.AllowNetworkMounts {
		writeError(w, errs.Field("path", "%s is on a network filesystem (%s), where changes made elsewhere are not seen; set allow_network_mounts to watch it anyway", root, fsName))
		return
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		writeError(w, errs.Wrap(errs.ResourceExhausted, err, "create watcher"))
		return
	}
	defer watcher.Close()
	if err := addTree(watcher, root, req.Recursive); err != nil {
		writeError(w, fsError(err, root))
		return
	}
	a.openStreams.Add(1)
	defer a.openStreams.Add(-1)
	out := startNDJSON(w, keepalive)
	defer out.stop()
	if err := out.write(agentapi.FSEvent{Type: "start"}); err != nil {
		return
	}
	emit := func(op, path string) bool {
		rel, err := filepath.Rel(root, path)
		if err != nil {
			rel = path
		}
		ev := agentapi.FSEvent{Type: op, Name: rel}
		if req.IncludeEntry && op != "remove" && op != "rename" {
			if info, err := entryInfo(db, path); err == nil {
				ev.Entry = &info
			}
		}
		return out.write(ev) == nil
	}
	// A file written through the agent is replaced atomically: a temporary
	// file is written and renamed over it (replaceFile). Watchers expect what
	// an in-place write shows (E2B's envd writes in place): a write of the
	// file, preceded by a create when it did not exist. replacing maps a
	// temporary file to whether its target existed when it was made.
	replacing := map[string]bool{}
	ctx := r.Context()
	for {
		select {
		case ev, ok := <-watcher.Events:
			if !ok {
				return
			}
			if m := replaceTemp.FindStringSubmatch(filepath.Base(ev.Name)); m != nil {
				target := filepath.Join(filepath.Dir(ev.Name), m[1])
				switch {
				case ev.Has(fsnotify.Create):
					if len(replacing) < maxCatchUp {
						replacing[ev.Name] = m[2] == "e"
					}
				case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
					// Rename: moved over its target, whose create follows.
					if existed, ok := replacing[ev.Name]; ok && ev.Has(fsnotify.Rename) {
						replacing[target+"\x00"] = existed
					}
					delete(replacing, ev.Name)
				}
				continue
			}
			if existed, ok := replacing[ev.Name+"\x00"]; ok && ev.Has(fsnotify.Create) {
				delete(replacing, ev.Name+"\x00")
				if !existed && !emit("create", ev.Name) {
					return
				}
				if !emit("write", ev.Name) {
					return
				}
				continue
			}
			for _, o := range watchOps {
				if ev.Has(o.op) && !emit(o.name, ev.Name) {
					return
				}
			}
			if req.Recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					_ = addTree(watcher, ev.Name, true)
					catchUp(ev.Name, emit)
				}
			}
		case err, ok := <-watcher.Errors:
			if !ok {
				return
			}
			a.log.Warn("watch", "path", root, "err", err)
		case <-out.keepalive():
			if err := out.write(agentapi.FSEvent{Type: "keepalive"}); err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
