package auth

import (
	"net/http"

	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/sandbox"
)

// SetClusterToken turns on cluster mode's principal (docs/CLUSTER.md): a
// request signed by an API replica with this token acts as the principal
// it names. "" (single host) keeps it off, and then every request that
// carries a cluster header is refused. Call it before serving.
func (s *Service) SetClusterToken(token string) { s.clusterToken = token }

// ClusterPrincipal reads the principal of a replica's signed request. ok
// is false for a request without cluster headers (authenticate it by its
// key); cluster headers that do not verify are an Unauthenticated error,
// never a fall-back to the key.
func (s *Service) ClusterPrincipal(r *http.Request) (p Principal, ok bool, err error) {
	cp, ok, err := peer.Verify(r, s.clusterToken)
	if err != nil || !ok {
		return Principal{}, false, err
	}
	if cp.Owner != "" {
		if err := ValidOwner("cluster principal owner", cp.Owner); err != nil {
			return Principal{}, false, errs.E(errs.Unauthenticated, "%v", err)
		}
	}
	return Principal{Owner: cp.Owner, Admin: cp.Admin, Cluster: true}, true, nil
}

// Request authenticates a request: a replica's signed principal when it
// carries one, else key (the caller's API key, "" = none sent).
func (s *Service) Request(r *http.Request, key string) (Principal, error) {
	p, ok, err := s.ClusterPrincipal(r)
	if err != nil {
		return Principal{}, err
	}
	if ok {
		return p, nil
	}
	return s.Authenticate(r.Context(), key)
}

// GivenSandboxID is the id a replica chose for the sandbox a create
// request makes (peer.HeaderSandboxID): honoured only on a request p was
// verified from (p.Cluster); "" = none given, the node picks one.
func GivenSandboxID(r *http.Request, p Principal) (string, error) {
	id := r.Header.Get(peer.HeaderSandboxID)
	if !p.Cluster || id == "" {
		return "", nil
	}
	if !sandbox.ValidID(id) {
		return "", errs.Field(peer.HeaderSandboxID, "must be 1-64 lowercase letters and digits, got %q", id)
	}
	return id, nil
}

// ClusterGate refuses, before any route sees it, a request whose cluster
// headers do not verify (a forged replica), so no route that does not
// itself read a principal (envd, ports, health) lets one through unnoticed.
func (s *Service) ClusterGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := peer.Verify(r, s.clusterToken); err != nil {
			httpx.WriteError(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}
