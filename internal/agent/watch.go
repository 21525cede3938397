package agent

import (
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

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
	acct, _, err := a.account(req.User)
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
	ctx := r.Context()
	for {
		select {
		case ev, ok := <-watcher.Events:
			if !ok {
				return
			}
			rel, err := filepath.Rel(root, ev.Name)
			if err != nil {
				rel = ev.Name
			}
			if req.Recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					_ = addTree(watcher, ev.Name, true)
				}
			}
			for _, o := range watchOps {
				if ev.Has(o.op) {
					if err := out.write(agentapi.FSEvent{Type: o.name, Name: rel}); err != nil {
						return
					}
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
