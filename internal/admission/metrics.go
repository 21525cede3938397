package admission

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/store"
)

// PoolMetric is one warm pool's counters for /metrics.
type PoolMetric struct {
	Template     string
	Hits, Misses int64
	Ready        int
}

// WriteMetrics writes the Prometheus text exposition format (version
// 0.0.4): sandboxes by state and owner, creates and their latency, quota
// rejections, reaper actions by reason and metered usage per owner. The
// format is small enough that berth writes it itself rather than pulling
// in client_golang. pools are the warm pools' counters (nil: the pool
// families are left out, as when listing the pools failed).
func (a *Service) WriteMetrics(ctx context.Context, w io.Writer, pools []PoolMetric) error {
	list, _, err := a.core.Store().ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return err
	}
	usage, err := a.core.Store().ListUsage(ctx, store.UsageFilter{})
	if err != nil {
		return err
	}
	var b strings.Builder
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	sample := func(name string, labels []string, v float64) {
		b.WriteString(name)
		if len(labels) > 0 {
			b.WriteByte('{')
			for i := 0; i < len(labels); i += 2 {
				if i > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, "%s=%s", labels[i], strconv.Quote(labels[i+1]))
			}
			b.WriteByte('}')
		}
		b.WriteByte(' ')
		b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		b.WriteByte('\n')
	}

	family("berth_sandboxes", "gauge", "Sandboxes by state and owner.")
	counts := map[[2]string]int{}
	for _, sb := range list {
		counts[[2]string{string(sb.State), sb.Owner}]++
	}
	for _, k := range sortedPairs(counts) {
		sample("berth_sandboxes", []string{"state", k[0], "owner", k[1]}, float64(counts[k]))
	}

	a.mMu.Lock()
	family("berth_sandbox_create_seconds", "histogram", "Time from a create's intent to its agent answering.")
	for i, bound := range createBounds {
		sample("berth_sandbox_create_seconds_bucket", []string{"le", strconv.FormatFloat(bound, 'g', -1, 64)}, float64(a.createBuckets[i]))
	}
	sample("berth_sandbox_create_seconds_bucket", []string{"le", "+Inf"}, float64(a.creates))
	sample("berth_sandbox_create_seconds_sum", nil, a.createSum)
	sample("berth_sandbox_create_seconds_count", nil, float64(a.creates))
	family("berth_sandbox_creates_total", "counter", "Sandboxes created (ready) since the daemon started.")
	sample("berth_sandbox_creates_total", nil, float64(a.creates))
	family("berth_quota_rejections_total", "counter", "Creates refused by a quota, by the limit named.")
	for _, k := range sortedKeys(a.rejections) {
		sample("berth_quota_rejections_total", []string{"limit", k}, float64(a.rejections[k]))
	}
	family("berth_reaper_actions_total", "counter", "Reaper actions by action and reason.")
	for _, k := range sortedPairs(a.actions) {
		sample("berth_reaper_actions_total", []string{"action", k[0], "reason", k[1]}, float64(a.actions[k]))
	}
	lr := a.lastRound
	family("berth_reaper_rounds_total", "counter", "Reaper rounds (sampling, metering, decisions) completed.")
	sample("berth_reaper_rounds_total", nil, float64(a.rounds))
	family("berth_reaper_round_sandboxes", "gauge", "Sandboxes the last reaper round visited.")
	sample("berth_reaper_round_sandboxes", nil, float64(lr.Sandboxes))
	family("berth_reaper_round_start_seconds", "gauge", "When the last reaper round started (Unix time).")
	sample("berth_reaper_round_start_seconds", nil, float64(lr.At.UnixMilli())/1000)
	family("berth_reaper_round_seconds", "gauge", "Wall time of the last reaper round.")
	sample("berth_reaper_round_seconds", nil, lr.Wall.Seconds())
	family("berth_reaper_round_cpu_seconds", "gauge", "Process CPU (daemon and its runtime commands) during the last reaper round, by phase.")
	sample("berth_reaper_round_cpu_seconds", []string{"phase", "metering"}, lr.MeterCPU.Seconds())
	sample("berth_reaper_round_cpu_seconds", []string{"phase", "reaping"}, lr.ReapCPU.Seconds())
	a.mMu.Unlock()

	if pools != nil {
		family("berth_pool_hits_total", "counter", "Creates served from a warm pool.")
		for _, p := range pools {
			sample("berth_pool_hits_total", []string{"template", p.Template}, float64(p.Hits))
		}
		family("berth_pool_misses_total", "counter", "Creates a warm pool could not serve.")
		for _, p := range pools {
			sample("berth_pool_misses_total", []string{"template", p.Template}, float64(p.Misses))
		}
		family("berth_pool_ready", "gauge", "Ready members per warm pool.")
		for _, p := range pools {
			sample("berth_pool_ready", []string{"template", p.Template}, float64(p.Ready))
		}
	}

	byOwner := map[string][]metering.Usage{}
	for _, u := range usage {
		byOwner[u.Owner] = append(byOwner[u.Owner], u)
	}
	owners := sortedKeys(byOwner)
	totals := map[string]metering.Usage{}
	for _, o := range owners {
		totals[o] = metering.Total(byOwner[o])
	}
	for _, m := range []struct {
		name, help string
		get        func(metering.Usage) float64
	}{
		{"berth_usage_cpu_seconds_total", "Metered CPU-seconds (cgroup cpuacct).", func(u metering.Usage) float64 { return u.CPUSeconds }},
		{"berth_usage_memory_gib_seconds_total", "Metered memory GiB-seconds.", func(u metering.Usage) float64 { return u.MemGiBSeconds }},
		{"berth_usage_disk_gib_hours_total", "Metered disk GiB-hours (allocated workspace blocks + memory images).", func(u metering.Usage) float64 { return u.DiskGiBHours }},
	} {
		family(m.name, "counter", m.help)
		for _, o := range owners {
			sample(m.name, []string{"owner", o}, m.get(totals[o]))
		}
	}
	family("berth_usage_wall_seconds_total", "counter", "Wall-clock seconds by metering state.")
	for _, o := range owners {
		t := totals[o]
		for _, s := range []struct {
			state string
			v     float64
		}{{metering.BucketRunning, t.RunningSeconds}, {metering.BucketFrozen, t.FrozenSeconds},
			{metering.BucketPaused, t.PausedSeconds}, {metering.BucketStopped, t.StoppedSeconds}} {
			sample("berth_usage_wall_seconds_total", []string{"owner", o, "state", s.state}, s.v)
		}
	}
	_, err = io.WriteString(w, b.String())
	return err
}

func sortedPairs[V any](m map[[2]string]V) [][2]string {
	out := make([][2]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i][0] != out[j][0] {
			return out[i][0] < out[j][0]
		}
		return out[i][1] < out[j][1]
	})
	return out
}
