package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// The secrets mirror (docs/CLUSTER.md, "Secrets"). The cluster's secrets
// are kubestore records sealed under the cluster data key; the agent keeps
// its daemon's own store equal to them: every record opened and put through
// the daemon's secret service (hostnet.PutSecret: validated again, re-sealed
// under this node's key, and the proxy's grants of the sandboxes using it
// refreshed), every local secret the cluster no longer has deleted the same
// way. So the daemon's egress path, its leases and its sealed-at-rest store
// are exactly one host's, and a sandbox runs on while the API server is
// away. Only the secrets of owners with a sandbox here are kept: a node's
// disk holds no credential it has no use for. The cluster is the only
// source: a secret set on a node's own API is removed by the next pass.
//
// A pass runs on every change of a secrets record (a watch, so a put or a
// delete through any replica reaches the proxy in well under a second), every
// secretResync, and before a forwarded create that grants secrets (Prefetch),
// so a secret set a moment before the create is already here.

// secretSource is kubestore's secrets table as a node reads it.
type secretSource interface {
	ListSecrets(ctx context.Context, owner string) ([]store.Secret, error)
}

// secretResync is the full pass's period beside the watch (a missed event,
// a local secret removed behind the agent's back).
const secretResync = 30 * time.Second

// secretMirror is the mirror's state: one pass at a time.
type secretMirror struct {
	mu      sync.Mutex
	sealer  *kubestore.Sealer
	applied map[string]string // owner/name → secretVersion of the record last put here
}

func secretKey(s store.Secret) string { return s.Owner + "/" + s.Name }

// secretVersion identifies a record's content: a put seals with a fresh
// nonce, so any put through a replica changes it.
func secretVersion(s store.Secret) string {
	h := sha256.New()
	for _, p := range [][]byte{[]byte(s.Host), {0}, []byte(s.Header), {0}, s.Sealed} {
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// DecideSecrets is a pass's plan: the cluster records of owners to put
// here (new, changed since applied, or missing locally) and the local
// secrets to delete (the cluster has no such owner/name, or its owner has
// nothing on this node).
func DecideSecrets(cluster, local []store.Secret, owners map[string]bool, applied map[string]string) (put, del []store.Secret) {
	inCluster := map[string]bool{}
	wanted := cluster[:0:0]
	for _, c := range cluster {
		if owners[c.Owner] {
			inCluster[secretKey(c)] = true
			wanted = append(wanted, c)
		}
	}
	cluster = wanted
	here := map[string]store.Secret{}
	for _, l := range local {
		here[secretKey(l)] = l
		if !inCluster[secretKey(l)] {
			del = append(del, l)
		}
	}
	for _, c := range cluster {
		l, ok := here[secretKey(c)]
		if !ok || applied[secretKey(c)] != secretVersion(c) || l.Host != c.Host || l.Header != c.Header {
			put = append(put, c)
		}
	}
	return put, del
}

// SyncSecrets is one pass: list both sides, put and delete. Every record
// is tried; the first error is returned after.
func (a *Agent) SyncSecrets(ctx context.Context) error {
	src, ok := a.cfg.Cluster.(secretSource)
	if !ok {
		return errs.E(errs.FailedPrecondition, "node agent: the cluster store keeps no secrets")
	}
	m := &a.secrets
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sealer == nil {
		s, err := kubestore.EnsureSecretsKey(ctx, a.cfg.Kube, a.cfg.Namespace)
		if err != nil {
			return err
		}
		m.sealer, m.applied = s, map[string]string{}
	}
	owners, err := a.secretOwners(ctx)
	if err != nil {
		return err
	}
	cluster, err := src.ListSecrets(ctx, "")
	if err != nil {
		return errs.Wrap(errs.KindOf(err), err, "list the cluster's secrets")
	}
	local, err := a.cfg.Daemon.Store().ListSecrets(ctx, "")
	if err != nil {
		return errs.Wrap(errs.KindOf(err), err, "list this node's secrets")
	}
	put, del := DecideSecrets(cluster, local, owners, m.applied)
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, s := range del {
		err := a.cfg.Daemon.Net().DeleteSecret(ctx, s.Owner, s.Name)
		if err != nil && !errs.Is(err, errs.NotFound) {
			keep(errs.Wrap(errs.KindOf(err), err, "delete secret %s of %s here", s.Name, s.Owner))
			continue
		}
		delete(m.applied, secretKey(s))
		a.log.Info("secret deleted in the cluster: removed here", "owner", s.Owner, "secret", s.Name)
	}
	for _, s := range put {
		val, err := m.sealer.Open(s)
		if err != nil {
			keep(err)
			continue
		}
		_, err = a.cfg.Daemon.Net().PutSecret(ctx, s.Owner, s.Name, s.Host, s.Header, val)
		clear(val)
		if err != nil {
			keep(errs.Wrap(errs.KindOf(err), err, "put secret %s of %s here", s.Name, s.Owner))
			continue
		}
		m.applied[secretKey(s)] = secretVersion(s)
		a.log.Info("secret mirrored from the cluster", "owner", s.Owner, "secret", s.Name)
	}
	inCluster := map[string]bool{}
	for _, c := range cluster {
		if owners[c.Owner] {
			inCluster[secretKey(c)] = true
		}
	}
	for k := range m.applied { // forgotten here too: a re-created record is put again
		if !inCluster[k] {
			delete(m.applied, k)
		}
	}
	return first
}

// secretOwners is whose secrets this node needs: the owners of the Sandbox
// objects bound to it (not lost or deleted) and of its local sandboxes. A
// replica writes the object before it forwards the create, so a create's
// owner is in the set by the time Prefetch's pass runs.
func (a *Agent) secretOwners(ctx context.Context) (map[string]bool, error) {
	objs, err := a.cfg.Cluster.SandboxesOnNode(ctx, a.cfg.Name)
	if err != nil {
		return nil, errs.Wrap(errs.KindOf(err), err, "list the sandboxes bound here")
	}
	local, _, err := a.cfg.Daemon.Store().ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return nil, errs.Wrap(errs.KindOf(err), err, "list this node's sandboxes")
	}
	out := map[string]bool{}
	for _, sb := range append(objs, local...) {
		if sb.State != sandbox.Lost && sb.State != sandbox.Deleted {
			out[sb.Owner] = true
		}
	}
	return out, nil
}

// runSecrets keeps the mirror: a pass at start, on every event of a
// watch on the secrets' records (reopened after it ends), and every
// secretResync. It returns when ctx ends.
func (a *Agent) runSecrets(ctx context.Context) {
	if _, ok := a.cfg.Cluster.(secretSource); !ok {
		return
	}
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.watchSecrets(ctx, poke)
	}()
	tick := time.NewTicker(secretResync)
	defer tick.Stop()
	poke()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-tick.C:
		}
		if err := a.SyncSecrets(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("mirror the cluster's secrets", "err", err)
		}
	}
}

// watchSecrets calls poke on every change of a secrets record; any end of
// the watch (the API server's timeout, an error) reopens it a second later
// with a pass, since events may have been missed in between.
func (a *Agent) watchSecrets(ctx context.Context, poke func()) {
	sel := kube.ListOptions{LabelSelector: berthv1.LabelTable + "=" + kubestore.SecretsTable, TimeoutSeconds: 600}
	for ctx.Err() == nil {
		w, err := a.cfg.Kube.Watch(ctx, berthv1.Records, a.cfg.Namespace, sel)
		if err == nil {
			for {
				if _, err = w.Next(); err != nil {
					break
				}
				poke()
			}
			w.Close()
		}
		if ctx.Err() != nil {
			return
		}
		a.log.Debug("secrets watch ended, reopening", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		poke()
	}
}
