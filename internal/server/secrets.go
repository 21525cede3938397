package server

import (
	"net/http"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
)

// SecretRequest is the body of PUT /v1/secrets/{name}.
type SecretRequest = wire.SecretRequest

// secretOwner is whose secrets a request manages: the key's owner, or for
// the admin key ?owner= (default: the admin's own).
func secretOwner(r *http.Request, p daemon.Principal) (string, error) {
	if o := r.URL.Query().Get("owner"); o != "" {
		if !p.Admin && o != p.Owner {
			return "", errs.Field("owner", "only the admin key may manage another owner's secrets")
		}
		return o, nil
	}
	return p.Owner, nil
}

func (s netAPI) putSecret(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req SecretRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	own, err := secretOwner(r, p)
	if err != nil {
		return err
	}
	info, err := s.d.Net().PutSecret(r.Context(), own, r.PathValue("name"), req.Host, req.Header, []byte(req.Value))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.SecretInfo(info))
	return nil
}

func (s netAPI) listSecrets(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	own, err := secretOwner(r, p)
	if err != nil {
		return err
	}
	list, err := s.d.Net().ListSecrets(r.Context(), own)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.SecretList{Secrets: secretViews(list)})
	return nil
}

func (s netAPI) deleteSecret(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	own, err := secretOwner(r, p)
	if err != nil {
		return err
	}
	if err := s.d.Net().DeleteSecret(r.Context(), own, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
