package server

import (
	"net/http"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// leasesAPI serves credential leases (internal/leases, docs/LEASES.md).
type leasesAPI struct{ *Server }

func leaseView(l store.Lease) wire.Lease {
	out := wire.Lease{ID: l.ID, SandboxID: l.SandboxID, Generation: l.Generation, Secret: l.Secret, Host: l.Host,
		Header: l.Header, Placeholder: l.Placeholder, IssuedAt: l.IssuedAt, State: l.State, Reason: l.Reason, ChangedAt: l.ChangedAt}
	if !l.ExpiresAt.IsZero() {
		t := l.ExpiresAt.UTC()
		out.ExpiresAt = &t
	}
	return out
}

func leaseList(ls []store.Lease) wire.LeaseList {
	out := wire.LeaseList{Leases: make([]wire.Lease, 0, len(ls))}
	for _, l := range ls {
		out.Leases = append(out.Leases, leaseView(l))
	}
	return out
}

// sandboxLeases: GET /v1/sandboxes/{id}/leases. A sandbox (the in-sandbox
// API) sees its own leases only.
func (s leasesAPI) sandboxLeases(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id := r.PathValue("id")
	if p.Sandbox != "" && id != p.Sandbox {
		return errs.E(errs.NotFound, "sandbox %s not found", id)
	}
	ls, err := s.d.Leases().List(r.Context(), owner(r, p), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, leaseList(ls))
	return nil
}

// listLeases: GET /v1/leases, the caller's (the admin's: ?owner= or all).
func (s leasesAPI) listLeases(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if p.Sandbox != "" {
		ls, err := s.d.Leases().List(r.Context(), p.Owner, p.Sandbox)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, leaseList(ls))
		return nil
	}
	ls, err := s.d.Leases().ListAll(r.Context(), owner(r, p))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, leaseList(ls))
	return nil
}

// revokeLease: DELETE /v1/leases/{id}. A sandbox may not revoke (its own
// credentials are the owner's to manage).
func (s leasesAPI) revokeLease(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if p.Sandbox != "" {
		return errs.E(errs.PermissionDenied, "a sandbox may not revoke leases")
	}
	l, err := s.d.Leases().Revoke(r.Context(), owner(r, p), p.Owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, leaseView(l))
	return nil
}
