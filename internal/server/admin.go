package server

import (
	"net/http"
	"os"
	goruntime "runtime"
	"strconv"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func (s *Server) events(w http.ResponseWriter, r *http.Request, f store.EventFilter) error {
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
	if list == nil {
		list = []sandbox.Event{}
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id := r.PathValue("id")
	own := owner(r, p)
	// Events outlive the sandbox row, so check ownership on the events themselves.
	return s.events(w, r, store.EventFilter{SandboxID: id, Owner: own})
}

func (s *Server) allEvents(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	return s.events(w, r, store.EventFilter{Owner: owner(r, p), SandboxID: r.URL.Query().Get("sandbox")})
}

type keyRequest struct {
	Owner string `json:"owner"`
}

type keyResponse struct {
	Owner string `json:"owner"`
	Key   string `json:"key"`
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
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
type RuntimeInfo struct {
	Name             string `json:"name"`
	Checkpoint       bool   `json:"checkpoint"`
	CheckpointReason string `json:"checkpoint_reason,omitempty"`
	Freeze           bool   `json:"freeze"`
	Default          bool   `json:"default"`
	// Isolation is how the runtime keeps a sandbox from the host:
	// "namespaces+userns+seccomp" or "namespaces+seccomp" (runc), "gVisor" (runsc).
	Isolation string `json:"isolation"`
	// UserNS is the host id range new sandboxes' ids map to (runc).
	UserNS *UserNSInfo `json:"userns,omitempty"`
}

// UserNSInfo is a user namespace mapping: ids 0..size-1 inside are host ids host_id...
type UserNSInfo struct {
	HostID uint32 `json:"host_id"`
	Size   uint32 `json:"size"`
}

// Info is the body of GET /v1/info.
type Info struct {
	Version  string        `json:"version"`
	Owner    string        `json:"owner"`
	Admin    bool          `json:"admin"`
	DataDir  string        `json:"data_dir,omitempty"`
	Runtimes []RuntimeInfo `json:"runtimes"`
	CPUs     int           `json:"cpus"`
	Hostname string        `json:"hostname"`
}

// Version is set by main.
var Version = "dev"

func (s *Server) info(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
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
