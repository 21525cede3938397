package api

import (
	"context"
	"net/http"
	"sync"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/store"
)

// Secrets on a replica (docs/CLUSTER.md, "Secrets"): PUT, GET and DELETE
// /v1/secrets as on one host, in the cluster store, each value sealed under
// the cluster data key (kubestore.EnsureSecretsKey) before it is written:
// etcd holds only the sealed value. Nodes mirror the records into their own
// daemons' stores (internal/cluster/node, secrets.go), where the egress
// proxy and the leases find them as on one host.

// secretStore is kubestore's secrets table.
type secretStore interface {
	PutSecret(ctx context.Context, sec store.Secret) (store.Secret, error)
	ListSecrets(ctx context.Context, owner string) ([]store.Secret, error)
	DeleteSecret(ctx context.Context, owner, name string) error
}

// secretKeys is the cluster data key, read (or made) on first use and kept:
// a failure (the API server away) is retried by the next request.
type secretKeys struct {
	mu     sync.Mutex
	sealer *kubestore.Sealer
}

func (r *Replica) sealer(ctx context.Context) (*kubestore.Sealer, error) {
	r.secrets.mu.Lock()
	defer r.secrets.mu.Unlock()
	if r.secrets.sealer == nil {
		s, err := kubestore.EnsureSecretsKey(ctx, r.cfg.Kube, r.cfg.Namespace)
		if err != nil {
			return nil, err
		}
		r.secrets.sealer = s
	}
	return r.secrets.sealer, nil
}

func (r *Replica) secretStore() (secretStore, error) {
	ss, ok := r.cfg.Store.(secretStore)
	if !ok {
		return nil, errs.E(errs.NotImplemented, "this replica's store keeps no secrets")
	}
	return ss, nil
}

func (r *Replica) secretRoutes(mux *http.ServeMux) {
	r.handle(mux, "GET /v1/secrets", r.listSecrets)
	r.handle(mux, "PUT /v1/secrets/{name}", r.putSecret)
	r.handle(mux, "DELETE /v1/secrets/{name}", r.deleteSecret)
}

// secretOwner is whose secrets a request manages, as on one host: the
// key's owner, or for the admin key ?owner= (default: the admin's own).
func secretOwner(req *http.Request, p auth.Principal) (string, error) {
	if o := req.URL.Query().Get("owner"); o != "" {
		if !p.Admin && o != p.Owner {
			return "", errs.Field("owner", "only the admin key may manage another owner's secrets")
		}
		return o, nil
	}
	return p.Owner, nil
}

// secretNameRe: a secret's name is the env var holding its placeholder in
// a sandbox (hostnet's rule; the node's daemon checks it again).
var secretNameRe = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

const defaultSecretHeader = "Authorization: Bearer {{value}}"

// validSecret checks a secret as the node's proxy will use it, so a bad
// one is refused here, naming the field, and never reaches a node.
func validSecret(name string, req *wire.SecretRequest) error {
	if !secretNameRe.MatchString(name) {
		return errs.Field("name", "must be an env var name ([A-Za-z_][A-Za-z0-9_]*, up to 64), got %q", name)
	}
	if req.Header == "" {
		req.Header = defaultSecretHeader
	}
	if req.Value == "" {
		return errs.Field("value", "must not be empty")
	}
	g := egress.Grant{Name: name, Host: req.Host, HeaderTemplate: req.Header, Value: req.Value, Placeholder: egress.NewPlaceholder(name)}
	if err := g.Validate(); err != nil {
		return err
	}
	if rule, err := egress.ParseRule(req.Host); err != nil || rule.Kind != egress.RuleHost || rule.Port != 0 {
		return errs.Field("host", "must be a hostname without port or wildcard, got %q", req.Host)
	}
	return nil
}

func secretView(s store.Secret) wire.SecretInfo {
	return wire.SecretInfo{Name: s.Name, Host: s.Host, Header: s.Header, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

func (r *Replica) putSecret(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	var body wire.SecretRequest
	if err := httpx.Decode(req, &body); err != nil {
		return err
	}
	own, err := secretOwner(req, p)
	if err != nil {
		return err
	}
	name := req.PathValue("name")
	if err := validSecret(name, &body); err != nil {
		return err
	}
	ss, err := r.secretStore()
	if err != nil {
		return err
	}
	sl, err := r.sealer(req.Context())
	if err != nil {
		return err
	}
	sealed, err := sl.Seal(own, name, []byte(body.Value))
	if err != nil {
		return err
	}
	stored, err := ss.PutSecret(req.Context(), store.Secret{Owner: own, Name: name, Host: body.Host, Header: body.Header,
		Sealed: sealed, UpdatedAt: r.now().UTC()})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, secretView(stored))
	return nil
}

func (r *Replica) listSecrets(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	own, err := secretOwner(req, p)
	if err != nil {
		return err
	}
	ss, err := r.secretStore()
	if err != nil {
		return err
	}
	list, err := ss.ListSecrets(req.Context(), own)
	if err != nil {
		return err
	}
	out := wire.SecretList{Secrets: make([]wire.SecretInfo, 0, len(list))}
	for _, s := range list {
		out.Secrets = append(out.Secrets, secretView(s))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (r *Replica) deleteSecret(w http.ResponseWriter, req *http.Request, p auth.Principal) error {
	own, err := secretOwner(req, p)
	if err != nil {
		return err
	}
	ss, err := r.secretStore()
	if err != nil {
		return err
	}
	if err := ss.DeleteSecret(req.Context(), own, req.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
