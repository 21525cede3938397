package server

import (
	"net/http"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Template is the API view of a template.
type Template = wire.Template

func templateView(t store.Template) Template {
	if t.Layers == nil {
		t.Layers = []string{}
	}
	return Template{Name: t.Name, Fingerprint: t.Fingerprint, Layers: t.Layers, State: t.State, Progress: t.Progress,
		Error: t.Error, Source: t.Source, StartCmd: t.StartCmd, Env: t.Env, Workdir: t.Workdir, User: t.User, Resources: wire.Resources(t.Resources),
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}

func (s imageAPI) listTemplates(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	list, err := s.d.Store().ListTemplates(r.Context())
	if err != nil {
		return err
	}
	out := make([]Template, 0, len(list))
	for _, t := range list {
		out = append(out, templateView(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s imageAPI) getTemplate(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	t, err := s.d.Store().GetTemplate(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, templateView(t))
	return nil
}

// importTemplate stores the request body (a rootfs tarball) as template {name}.
func (s imageAPI) importTemplate(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if !p.Admin {
		return errs.E(errs.PermissionDenied, "only the admin key may import templates")
	}
	t, err := s.d.Templates().Import(r.Context(), r.PathValue("name"), r.Body, r.URL.Query().Get("source"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, templateView(t))
	return nil
}
