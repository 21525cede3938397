package daemon

import (
	"context"
	"io"

	"github.com/berth-dev/berth/internal/admission"
)

// Quota admission, live signals, metering and metrics are the admission
// service's; the lifecycle calls it directly (d.adm.Admit, ...), and the
// handlers through Admission().

// Admission is the quota, usage and metrics service.
func (d *Daemon) Admission() *admission.Service { return d.adm }

func (c *Config) admissionConfig() admission.Config {
	return admission.Config{Reaper: c.Reaper, Quotas: c.Quotas, Prices: c.Prices, CgroupRoot: c.CgroupRoot}
}

// validateAccounting checks the reaper, quota and price config.
func (c *Config) validateAccounting() error { return c.admissionConfig().Validate() }

// WriteMetrics writes /metrics: the admission service's families and the
// warm pools' counters.
func (d *Daemon) WriteMetrics(ctx context.Context, w io.Writer) error {
	var pm []admission.PoolMetric
	if pools, err := d.Pools().List(ctx); err == nil {
		pm = make([]admission.PoolMetric, 0, len(pools))
		for _, p := range pools {
			pm = append(pm, admission.PoolMetric{Template: p.Template, Hits: p.Hits, Misses: p.Misses, Ready: p.Ready})
		}
	}
	return d.adm.WriteMetrics(ctx, w, pm)
}
