package server

import (
	"io"
	"mime"
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

// writeBatch serves POST /v1/sandboxes/{id}/files:batch: a tar body written
// beneath the directory ?path= by the agent, inside the sandbox, with one
// syncfs barrier for the whole batch (agentapi.BatchResult says what the
// answer promises). The body streams through; nothing is buffered here.
func (s sandboxAPI) writeBatch(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	if q.Get("path") == "" {
		return errs.Field("path", "must be set: the directory the tar's entries are written beneath")
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-tar" {
		return errs.Field("Content-Type", "must be application/x-tar, got %q", r.Header.Get("Content-Type"))
	}
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	// The root filesystem's barrier is taken here, on the host, when the
	// workspace image is mounted (daemon.SyncWorkspace says why); it is
	// taken whatever the agent answers, so the promise does not rest on it.
	id := r.PathValue("id")
	hostSync := s.d.WorkspaceBarrier(id)
	res, err := c.WriteBatchOptions(r.Context(), q.Get("path"), q.Get("user"), nil, r.Body, agentapi.BatchOptions{HostSync: hostSync})
	if err != nil {
		return err
	}
	if hostSync {
		took, err := s.d.SyncWorkspace(id)
		if err != nil {
			return err
		}
		res.Durable = "syncfs"
		res.SyncMS += float64(took.Microseconds()) / 1000
	}
	if res.Durable != "syncfs" {
		return errs.E(errs.Internal, "the agent answered the batch with durable %q", res.Durable)
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// readBatch serves GET /v1/sandboxes/{id}/files:batch: the tree beneath
// ?path= as a tar. A stream the agent cuts is cut here too, so a client never
// reads a partial tree as a whole one.
func (s sandboxAPI) readBatch(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	if q.Get("path") == "" {
		return errs.Field("path", "must be set")
	}
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	rc, err := c.ReadBatch(r.Context(), q.Get("path"), q.Get("user"))
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		panic(http.ErrAbortHandler)
	}
	return nil
}
