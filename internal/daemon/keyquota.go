package daemon

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// runc gives every container a session keyring, a key owned by the host
// uid its root maps to. All runc sandboxes map to one range (runcUserNS),
// so they share that uid's key quota, 200 keys by default
// (kernel.keys.maxkeys): the 190-somethingth sandbox failed to start with
// "unable to create session key: disk quota exceeded". The daemon raises
// the quota for non-root users to what a host full of sandboxes needs; it
// never lowers a setting an operator made larger.
const (
	keysDir     = "/proc/sys/kernel/keys"
	minMaxKeys  = 20000   // keys per user: one per sandbox, plus what tenants add
	minMaxBytes = 2000000 // bytes of key payload per user (a session keyring is ~26)
)

// raiseKeyQuota applies the minimums under dir (keysDir on a host).
func raiseKeyQuota(dir string, log *slog.Logger) error {
	var all []error
	for name, min := range map[string]int64{"maxkeys": minMaxKeys, "maxbytes": minMaxBytes} {
		raised, was, err := atLeast(filepath.Join(dir, name), min)
		if err != nil {
			all = append(all, err)
			continue
		}
		if raised {
			log.Info("raised the per-user key quota for runc sandboxes' session keyrings", "sysctl", "kernel.keys."+name, "from", was, "to", min)
		}
	}
	return errors.Join(all...)
}

// atLeast makes the integer in file path at least min.
func atLeast(path string, min int64) (raised bool, was int64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, 0, errs.Wrap(errs.Internal, err, "read %s", path)
	}
	was, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return false, 0, errs.Wrap(errs.Internal, err, "parse %s", path)
	}
	if was >= min {
		return false, was, nil
	}
	if err := os.WriteFile(path, []byte(strconv.FormatInt(min, 10)+"\n"), 0o644); err != nil {
		return false, was, errs.Wrap(errs.Internal, err, "write %s", path)
	}
	return true, was, nil
}
