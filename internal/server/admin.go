package server

import (
	"net/http"
	"os"
	goruntime "runtime"
	"strconv"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

func (s adminAPI) events(w http.ResponseWriter, r *http.Request, f store.EventFilter) error {
	q := r.URL.Query()
	if a := q.Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return errs.Field("after", "must be an event sequence number")
		}
		f.AfterSeq = n
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			return errs.Field("limit", "must be a non-negative integer")
		}
		f.Limit = n
	}
	list, err := s.d.Store().ListEvents(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, eventViews(list))
	return nil
}

func (s adminAPI) sandboxEvents(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id := r.PathValue("id")
	own := owner(r, p)
	// Events outlive the sandbox row, so check ownership on the events themselves.
	return s.events(w, r, store.EventFilter{SandboxID: id, Owner: own})
}

func (s adminAPI) allEvents(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	return s.events(w, r, store.EventFilter{Owner: owner(r, p), SandboxID: r.URL.Query().Get("sandbox")})
}

type keyRequest = wire.KeyRequest

type keyResponse = wire.KeyResponse

func (s adminAPI) createKey(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may create API keys")
	}
	var req keyRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	key, err := s.d.Auth().CreateKey(r.Context(), req.Owner, false)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, keyResponse{Owner: req.Owner, Key: key})
	return nil
}

// RuntimeInfo reports one backend's capabilities on this host.
type RuntimeInfo = wire.RuntimeInfo

type UserNSInfo = wire.UserNSInfo

// Info is the body of GET /v1/info.
type Info = wire.Info

// Version is set by main.
var Version = "dev"

func (s adminAPI) info(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	cfg := s.d.Config()
	in := Info{Version: Version, Owner: p.Owner, Admin: p.Admin, CPUs: goruntime.NumCPU()}
	in.Hostname, _ = os.Hostname()
	if p.Admin {
		in.DataDir = cfg.DataDir
	}
	for _, name := range []string{"runc", "runsc"} {
		rt, ok := s.d.Runtimes()[name]
		if !ok {
			continue
		}
		c := rt.Capabilities(r.Context())
		iso, m := s.d.Isolation(name)
		ri := RuntimeInfo{Name: name, Checkpoint: c.Checkpoint,
			CheckpointReason: c.CheckpointReason, Freeze: c.Freeze, Default: name == cfg.DefaultRuntime,
			Isolation: iso}
		if m != nil {
			ri.UserNS = &UserNSInfo{HostID: m.HostID, Size: m.Size}
		}
		in.Runtimes = append(in.Runtimes, ri)
	}
	writeJSON(w, http.StatusOK, in)
	return nil
}
