package server

import (
	"net/http"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// PoolRequest is the body of PUT /v1/pools/{template}.
type PoolRequest = wire.PoolRequest

func adminOnly(p daemon.Principal, what string) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may %s", what)
	}
	return nil
}

func (s imageAPI) listPools(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if err := adminOnly(p, "see warm pools"); err != nil {
		return err
	}
	list, err := s.d.Pools().List(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, poolViews(list))
	return nil
}

func (s imageAPI) setPool(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if err := adminOnly(p, "configure warm pools"); err != nil {
		return err
	}
	var req PoolRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Size == nil {
		return errs.Field("size", "must be set (0 keeps the pool empty)")
	}
	if req.CPU < 0 {
		return errs.Field("cpu", "must be positive")
	}
	st, err := s.d.Pools().Set(r.Context(), daemon.PoolSpec{
		Template: r.PathValue("template"), Size: *req.Size, Runtime: req.Runtime,
		Resources: sandbox.Resources{CPUMillis: int(req.CPU * 1000), MemoryMiB: req.MemoryMiB, DiskMiB: req.DiskMiB, Pids: req.Pids},
		Auto:      req.Auto, Min: req.Min, Max: req.Max,
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, poolView(st))
	return nil
}

func (s imageAPI) deletePool(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if err := adminOnly(p, "configure warm pools"); err != nil {
		return err
	}
	if err := s.d.Pools().Remove(r.Context(), r.PathValue("template")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
