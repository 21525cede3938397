package store

import (
	"context"
	"database/sql"
	"errors"

	"github.com/berth-dev/berth/internal/errs"
)

func (s *lifecycleTables) GetSetting(ctx context.Context, key string) (string, error) {
	var v string
	err := s.r.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errs.E(errs.NotFound, "setting %q not found", key)
	}
	if err != nil {
		return "", dbErr(err, "store: get setting %q", key)
	}
	return v, nil
}

func (s *lifecycleTables) PutSetting(ctx context.Context, key, val string) error {
	if key == "" {
		return errs.Field("key", "must not be empty")
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO settings (key, value) VALUES (?, ?)
			ON CONFLICT (key) DO UPDATE SET value = excluded.value`, key, val)
		if err != nil {
			return dbErr(err, "store: put setting %q", key)
		}
		return nil
	})
}
