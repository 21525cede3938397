package daemon

import (
	"context"
	"io"
	"time"

	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Quota admission, live signals, metering and metrics are the admission
// service's; these are the lifecycle's calls into it, kept under their old
// names so the lifecycle code reads as before.

// Admission is the quota, usage and metrics service.
func (d *Daemon) Admission() *admission.Service { return d.adm }

func (c *Config) admissionConfig() admission.Config {
	return admission.Config{Reaper: c.Reaper, Quotas: c.Quotas, Prices: c.Prices, CgroupRoot: c.CgroupRoot}
}

// validateAccounting checks the reaper, quota and price config.
func (c *Config) validateAccounting() error { return c.admissionConfig().Validate() }

func (d *Daemon) admit(ctx context.Context, sb *sandbox.Sandbox) error { return d.adm.Admit(ctx, sb) }

func (d *Daemon) admitClaim(ctx context.Context, req CreateRequest) (release func(), err error) {
	return d.adm.AdmitClaim(ctx, req.Owner, req.Resources, req.Attrs.IdlePolicy)
}

func (d *Daemon) reserveStart(ctx context.Context, sb *sandbox.Sandbox) (release func(), err error) {
	return d.adm.ReserveStart(ctx, sb)
}

func (d *Daemon) checkAdmit(ctx context.Context, owner string, r sandbox.Resources) error {
	return d.adm.CheckAdmit(ctx, owner, r)
}

func (d *Daemon) reserveSnapshot(ctx context.Context, owner string) (release func(), err error) {
	return d.adm.ReserveSnapshot(ctx, owner)
}

func (d *Daemon) noteAPI(id string) { d.adm.NoteAPI(id) }

// OpenStream records a client connected to sandbox id until done is called
// (admission.Service.OpenStream).
func (d *Daemon) OpenStream(id string) (done func()) { return d.adm.OpenStream(id) }

func (d *Daemon) observeCreate(took time.Duration) { d.adm.ObserveCreate(took) }

// SandboxStats reads a running sandbox's usage now (the e2b.Backend
// interface; admission.Service.SandboxStats).
func (d *Daemon) SandboxStats(ctx context.Context, owner, id string) (admission.SandboxStats, error) {
	return d.adm.SandboxStats(ctx, owner, id)
}

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
