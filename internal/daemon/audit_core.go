package daemon

import (
	"context"
	"path/filepath"

	"github.com/berth-dev/berth/internal/audit"
)

// auditCore is what the audit chain needs of the core.
type auditCore struct{ d *Daemon }

func (c auditCore) SandboxOwner(ctx context.Context, id string) (string, error) {
	sb, err := c.d.store.GetSandbox(ctx, id)
	if err != nil {
		return "", err
	}
	return sb.Owner, nil
}

// newAudit builds the audit chain with its key (DATA_DIR/audit.key, 0600,
// made on first start) and head file.
func newAudit(d *Daemon) (*audit.Service, error) {
	key, err := loadMasterKey(d.cfg.DataDir, audit.KeyFile, audit.KeySize)
	if err != nil {
		return nil, err
	}
	return audit.New(audit.Config{Key: key, HeadPath: filepath.Join(d.cfg.DataDir, audit.HeadFile),
		Log: d.log, Now: d.cfg.Now}, auditCore{d}, d.store), nil
}

// Audit is the audit chain: the REST middleware, the exec observer, the
// egress proxy, the lifecycle hooks and the state services append to it.
func (d *Daemon) Audit() *audit.Service { return d.audit }
