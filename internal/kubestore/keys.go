package kubestore

import (
	"context"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// API keys are two records: "apikeys" keyed by the key's hash, holding the
// key (a lookup, on every authenticated request, is one GET), and
// "apikeyids" keyed by id, holding the hash: each makes its field unique,
// as SQLite's primary key and unique index do.
const (
	tableAPIKeys  = "apikeys"
	tableAPIKeyID = "apikeyids"
	tableSettings = "settings"
	tableSecrets  = "secrets"
)

// CreateAPIKey claims the id, then the hash (undoing the id's claim when
// the hash is taken).
func (s *Store) CreateAPIKey(ctx context.Context, k store.APIKey) error {
	switch {
	case k.ID == "":
		return errs.Field("id", "must not be empty")
	case k.Owner == "":
		return errs.Field("owner", "must not be empty")
	case len(k.Hash) == 0:
		return errs.Field("hash", "must not be empty")
	}
	h := hex.EncodeToString(k.Hash)
	if err := s.insert(ctx, tableAPIKeyID, k.ID, 0, nil, h); err != nil {
		if errs.Is(err, errs.AlreadyExists) {
			return errs.E(errs.AlreadyExists, "api key %s already exists", k.ID)
		}
		return err
	}
	err := s.insert(ctx, tableAPIKeys, h, 0, map[string]string{"owner": k.Owner}, k)
	if err == nil {
		return nil
	}
	if rerr := s.remove(ctx, tableAPIKeyID, k.ID); rerr != nil && !errs.Is(rerr, errs.NotFound) {
		return errs.Wrap(errs.KindOf(err), err, "create api key %s (and undo its id: %v)", k.ID, rerr)
	}
	if errs.Is(err, errs.AlreadyExists) {
		return errs.E(errs.AlreadyExists, "api key %s: its hash already exists", k.ID)
	}
	return err
}

// LookupAPIKey is one GET of the hash's record.
func (s *Store) LookupAPIKey(ctx context.Context, hash []byte) (store.APIKey, error) {
	var k store.APIKey
	if _, err := s.get(ctx, tableAPIKeys, hex.EncodeToString(hash), &k); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.APIKey{}, errs.E(errs.NotFound, "api key not found")
		}
		return store.APIKey{}, err
	}
	return k, nil
}

// ListAPIKeys lists the hash records (owner's, or all) by id.
func (s *Store) ListAPIKeys(ctx context.Context, owner string) ([]store.APIKey, error) {
	match := map[string]string{}
	if owner != "" {
		match["owner"] = owner
	}
	rows, err := s.list(ctx, tableAPIKeys, match)
	if err != nil {
		return nil, err
	}
	out := []store.APIKey{}
	for _, r := range rows {
		var k store.APIKey
		if err := r.decode(&k); err != nil {
			return nil, err
		}
		if owner == "" || k.Owner == owner {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b store.APIKey) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// DeleteAPIKey removes the hash record first (the key stops working),
// then the id's.
func (s *Store) DeleteAPIKey(ctx context.Context, id string) error {
	var h string
	if _, err := s.get(ctx, tableAPIKeyID, id, &h); err != nil {
		if errs.Is(err, errs.NotFound) {
			return errs.E(errs.NotFound, "api key %s not found", id)
		}
		return err
	}
	if err := s.remove(ctx, tableAPIKeys, h); err != nil && !errs.Is(err, errs.NotFound) {
		return err
	}
	if err := s.remove(ctx, tableAPIKeyID, id); err != nil && !errs.Is(err, errs.NotFound) {
		return err
	}
	return nil
}

// GetSetting reads the setting's record.
func (s *Store) GetSetting(ctx context.Context, key string) (string, error) {
	var v string
	if _, err := s.get(ctx, tableSettings, key, &v); err != nil {
		if errs.Is(err, errs.NotFound) {
			return "", errs.E(errs.NotFound, "setting %q not found", key)
		}
		return "", err
	}
	return v, nil
}

// PutSetting replaces the setting's record.
func (s *Store) PutSetting(ctx context.Context, key, val string) error {
	if key == "" {
		return errs.Field("key", "must not be empty")
	}
	return s.upsert(ctx, tableSettings, key, 0, nil, val)
}

// PutSecret inserts or replaces (owner, name), keeping CreatedAt.
func (s *Store) PutSecret(ctx context.Context, sec store.Secret) (store.Secret, error) {
	switch {
	case sec.Owner == "":
		return store.Secret{}, errs.Field("owner", "must not be empty")
	case sec.Name == "":
		return store.Secret{}, errs.Field("name", "must not be empty")
	case sec.Host == "":
		return store.Secret{}, errs.Field("host", "must not be empty")
	case len(sec.Sealed) == 0:
		return store.Secret{}, errs.Field("value", "must not be empty")
	}
	now := s.now().UTC()
	if sec.UpdatedAt.IsZero() {
		sec.UpdatedAt = now
	}
	key := pairKey(sec.Owner, sec.Name)
	labels := map[string]string{"owner": sec.Owner}
	for {
		var cur store.Secret
		r, err := s.get(ctx, tableSecrets, key, &cur)
		switch {
		case errs.Is(err, errs.NotFound):
			if sec.CreatedAt.IsZero() {
				sec.CreatedAt = now
			}
			err = s.insert(ctx, tableSecrets, key, 0, labels, sec)
			if errs.Is(err, errs.AlreadyExists) {
				continue
			}
		case err == nil:
			sec.CreatedAt = cur.CreatedAt
			err = s.replace(ctx, r, labels, sec)
			if errs.Is(err, errs.Conflict) || errs.Is(err, errs.NotFound) {
				continue
			}
		}
		if err != nil {
			return store.Secret{}, err
		}
		return sec, nil
	}
}

// GetSecret reads (owner, name).
func (s *Store) GetSecret(ctx context.Context, owner, name string) (store.Secret, error) {
	var sec store.Secret
	if _, err := s.get(ctx, tableSecrets, pairKey(owner, name), &sec); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.Secret{}, errs.E(errs.NotFound, "secret %q not found", name)
		}
		return store.Secret{}, err
	}
	return sec, nil
}

// ListSecrets lists owner's secrets ("" = all) by owner, name.
func (s *Store) ListSecrets(ctx context.Context, owner string) ([]store.Secret, error) {
	match := map[string]string{}
	if owner != "" {
		match["owner"] = owner
	}
	rows, err := s.list(ctx, tableSecrets, match)
	if err != nil {
		return nil, err
	}
	var out []store.Secret
	for _, r := range rows {
		var sec store.Secret
		if err := r.decode(&sec); err != nil {
			return nil, err
		}
		if owner == "" || sec.Owner == owner {
			out = append(out, sec)
		}
	}
	slices.SortFunc(out, func(a, b store.Secret) int {
		if c := strings.Compare(a.Owner, b.Owner); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// DeleteSecret removes (owner, name).
func (s *Store) DeleteSecret(ctx context.Context, owner, name string) error {
	if err := s.remove(ctx, tableSecrets, pairKey(owner, name)); err != nil {
		if errs.Is(err, errs.NotFound) {
			return errs.E(errs.NotFound, "secret %q not found", name)
		}
		return err
	}
	return nil
}
