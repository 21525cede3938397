package server

import (
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
)

// readFile streams a file out of the sandbox. Paths are resolved by the agent
// inside the sandbox's own mount namespace, so "..", absolute symlinks and
// symlink swaps cannot reach the host.
func (s sandboxAPI) readFile(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	if q.Get("path") == "" {
		return errs.Field("path", "must be set")
	}
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	rc, size, err := c.ReadFile(r.Context(), q.Get("path"), q.Get("user"))
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, rc)
	return nil
}

func (s sandboxAPI) writeFile(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	if q.Get("path") == "" {
		return errs.Field("path", "must be set")
	}
	mode := os.FileMode(0o644)
	if m := q.Get("mode"); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil || n > 0o7777 {
			return errs.Field("mode", "must be octal permission bits like 0644")
		}
		mode = os.FileMode(n)
	}
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	info, err := c.WriteFile(r.Context(), q.Get("path"), q.Get("user"), mode, r.Body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

// fsOp serves stat, list, mkdir, move and remove.
func (s sandboxAPI) fsOp(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	op := r.PathValue("op")
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	ctx := r.Context()
	switch op {
	case "stat", "mkdir", "remove":
		var req agentapi.PathRequest
		if err := decode(r, &req); err != nil {
			return err
		}
		if req.Path == "" {
			return errs.Field("path", "must be set")
		}
		switch op {
		case "stat":
			e, err := c.Stat(ctx, req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, e)
		case "mkdir":
			e, err := c.Mkdir(ctx, req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, e)
		default:
			if err := c.Remove(ctx, req); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
		}
	case "list":
		var req agentapi.ListRequest
		if err := decode(r, &req); err != nil {
			return err
		}
		if req.Depth < 0 {
			return errs.Field("depth", "must not be negative")
		}
		list, err := c.List(ctx, req)
		if err != nil {
			return err
		}
		if list == nil {
			list = []agentapi.EntryInfo{}
		}
		writeJSON(w, http.StatusOK, list)
	case "move":
		var req agentapi.MoveRequest
		if err := decode(r, &req); err != nil {
			return err
		}
		if req.Source == "" || req.Destination == "" {
			return errs.Field("source", "source and destination must be set")
		}
		e, err := c.Move(ctx, req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, e)
	default:
		return errs.Field("op", "must be one of stat, list, mkdir, move, remove; got %q", op)
	}
	return nil
}
