package kubestore

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/store"
)

// SecretsKeyName is the Kubernetes Secret holding the cluster's data key
// (data key "key", 32 bytes): what the secrets' records are sealed under.
// It is not a key of berth-cluster on purpose: neither account may update
// a Secret (only get by name and create), so a deployment whose
// berth-cluster predates the data key could never gain one there.
const SecretsKeyName = "berth-secrets-key"

// SecretsTable is the secrets' records' table (label berth.dev/table):
// what a node agent watches to mirror them.
const SecretsTable = tableSecrets

// Sealer seals owners' secret values for the cluster store with AES-256-GCM
// under the cluster data key. Replicas seal (PUT /v1/secrets); node agents
// open, to re-seal each value under their own daemon's key in their local
// store (internal/cluster/node, secrets.go). Plaintext never reaches etcd.
type Sealer struct{ aead cipher.AEAD }

// EnsureSecretsKey returns the sealer of namespace ns, creating the data
// key's Secret when no one has (the first replica or node to need it; a
// concurrent second one reads the winner's), as peer.EnsureToken does.
func EnsureSecretsKey(ctx context.Context, kc *kube.Client, ns string) (*Sealer, error) {
	for range 3 {
		var s kube.Secret
		err := kc.Get(ctx, kube.Secrets, ns, SecretsKeyName, &s)
		if err == nil {
			return NewSealer(s.Data["key"])
		}
		if !errs.Is(err, errs.NotFound) {
			return nil, errs.Wrap(errs.KindOf(err), err, "cluster secrets key %s/%s", ns, SecretsKeyName)
		}
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "generate the cluster secrets key")
		}
		s = kube.Secret{TypeMeta: kube.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: kube.ObjectMeta{Name: SecretsKeyName, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/part-of": "berth"}},
			Type:       "Opaque", Data: map[string][]byte{"key": key}}
		err = kc.Create(ctx, kube.Secrets, ns, &s, nil)
		if err == nil {
			return NewSealer(key)
		}
		if !errs.Is(err, errs.AlreadyExists) {
			return nil, errs.Wrap(errs.KindOf(err), err, "create the cluster secrets key %s/%s", ns, SecretsKeyName)
		}
	}
	return nil, errs.E(errs.Unavailable, "secret %s/%s: could not read or create it", ns, SecretsKeyName)
}

// NewSealer is a sealer over a 32-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != 32 {
		return nil, errs.E(errs.FailedPrecondition, "secret %s: want a 32-byte key, got %d bytes", SecretsKeyName, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cluster secrets cipher")
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cluster secrets cipher")
	}
	return &Sealer{aead: aead}, nil
}

// secretAAD binds a sealed value to its row (a record's value cannot be
// moved to another owner's or name's record) and to the cluster store (a
// daemon's sealed value, under another key anyway, has another context).
// A name has no "/" (it is an env var name), so owner/name is unambiguous.
func secretAAD(owner, name string) []byte {
	return []byte("berth-cluster-secret\x00" + owner + "/" + name)
}

// Seal encrypts value for the record (owner, name).
func (s *Sealer) Seal(owner, name string, value []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "nonce")
	}
	return s.aead.Seal(nonce, nonce, value, secretAAD(owner, name)), nil
}

// Open decrypts a secret read from the cluster store.
func (s *Sealer) Open(sec store.Secret) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sec.Sealed) < n {
		return nil, errs.E(errs.InvalidArgument, "secret %s/%s: sealed value too short", sec.Owner, sec.Name)
	}
	pt, err := s.aead.Open(nil, sec.Sealed[:n], sec.Sealed[n:], secretAAD(sec.Owner, sec.Name))
	if err != nil {
		return nil, errs.Wrap(errs.PermissionDenied, err, "secret %s/%s: open the sealed value (another cluster's key?)", sec.Owner, sec.Name)
	}
	return pt, nil
}
