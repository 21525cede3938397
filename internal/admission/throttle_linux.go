package admission

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// SetCPUQuota rewrites a running sandbox's CFS quota (cgroup v1 cpu
// controller, the cgroup the OCI runtime created at /berth/<id>). The
// runtime interface has no update call; the cgroup is the contract both
// runc and runsc honour, and the next boot writes the sandbox's own quota.
func (a *Service) SetCPUQuota(id string, millis int) error {
	dir := filepath.Join(a.cfg.CgroupRoot, "cpu", "berth", id)
	period := int64(100000)
	if b, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us")); err == nil {
		if p, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && p > 0 {
			period = p
		}
	} else {
		return errs.Wrap(errs.Unavailable, err, "cpu cgroup of %s", id)
	}
	quota := int64(-1)
	if millis > 0 {
		quota = max(period*int64(millis)/1000, 1000)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(quota, 10)), 0o644); err != nil {
		return errs.Wrap(errs.Internal, err, "set cpu quota of %s", id)
	}
	return nil
}
