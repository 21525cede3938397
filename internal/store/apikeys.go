package store

import (
	"context"
	"database/sql"
	"errors"

	"github.com/berth-dev/berth/internal/errs"
)

func (s *lifecycleTables) CreateAPIKey(ctx context.Context, k APIKey) error {
	switch {
	case k.ID == "":
		return errs.Field("id", "must not be empty")
	case k.Owner == "":
		return errs.Field("owner", "must not be empty")
	case len(k.Hash) == 0:
		return errs.Field("hash", "must not be empty")
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys (id, owner, hash, admin, created_at) VALUES (?, ?, ?, ?, ?)`,
			k.ID, k.Owner, k.Hash, k.Admin, toNanos(k.CreatedAt))
		if err := dbErr(err, "store: create api key %s", k.ID); errs.Is(err, errs.AlreadyExists) {
			return errs.E(errs.AlreadyExists, "api key %s (or its hash) already exists", k.ID)
		} else if err != nil {
			return err
		}
		return nil
	})
}

const apiKeyCols = `id, owner, hash, admin, created_at`

func scanAPIKey(sc scanner) (APIKey, error) {
	var (
		k       APIKey
		created int64
	)
	if err := sc.Scan(&k.ID, &k.Owner, &k.Hash, &k.Admin, &created); err != nil {
		return APIKey{}, err
	}
	k.CreatedAt = fromNanos(created)
	return k, nil
}

func (s *lifecycleTables) LookupAPIKey(ctx context.Context, hash []byte) (APIKey, error) {
	k, err := scanAPIKey(s.r.QueryRowContext(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return APIKey{}, errs.E(errs.NotFound, "api key not found")
	}
	if err != nil {
		return APIKey{}, dbErr(err, "store: lookup api key")
	}
	return k, nil
}

func (s *lifecycleTables) ListAPIKeys(ctx context.Context, owner string) ([]APIKey, error) {
	q, args := `SELECT `+apiKeyCols+` FROM api_keys`, []any{}
	if owner != "" {
		q, args = q+` WHERE owner = ?`, append(args, owner)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY id`, args...)
	if err != nil {
		return nil, dbErr(err, "store: list api keys")
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		k, err := scanAPIKey(rows)
		if err != nil {
			return nil, dbErr(err, "store: list api keys")
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list api keys")
	}
	return out, nil
}

func (s *lifecycleTables) DeleteAPIKey(ctx context.Context, id string) error {
	return s.deleteByKey(ctx, "api_keys", "id", id, "api key")
}
