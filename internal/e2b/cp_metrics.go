package e2b

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/errs"
)

// metricJSON is E2B's SandboxMetric.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       uint64    `json:"memUsed"`
	MemTotal      uint64    `json:"memTotal"`
	MemCache      uint64    `json:"memCache"`
	DiskUsed      uint64    `json:"diskUsed"`
	DiskTotal     uint64    `json:"diskTotal"`
}

// Bounds of the metrics history: samples kept per sandbox, sandboxes kept.
const (
	maxMetricSamples   = 720
	maxMetricSandboxes = 4096
	// minMetricInterval: a reading closer than this to the previous one is
	// answered from history instead of read again.
	minMetricInterval = time.Second
)

// metricsHistory keeps the readings getMetrics has taken, per sandbox, so
// a later call with a time range gets the series. berth reads the cgroup
// when asked (it runs no sampler of its own for E2B); CPU use is the share
// of the allocation used since the previous reading (or since the start).
type metricsHistory struct {
	mu   sync.Mutex
	byID map[string]*metricSeries
}

type metricSeries struct {
	samples []metricJSON
	lastCPU uint64
	lastAt  time.Time
	touched time.Time
}

// record adds a reading of sandbox id and returns its series (a copy).
func (h *metricsHistory) record(id string, st admission.SandboxStats) []metricJSON {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byID == nil {
		h.byID = map[string]*metricSeries{}
	}
	s := h.byID[id]
	if s == nil || st.StartedAt.After(s.lastAt) {
		// New, or started again (resume): CPU counts from the start.
		if s == nil && len(h.byID) >= maxMetricSandboxes {
			h.evictLocked()
		}
		old := s
		s = &metricSeries{lastAt: st.StartedAt}
		if old != nil {
			s.samples = old.samples
		}
		h.byID[id] = s
	}
	s.touched = st.At
	if len(s.samples) > 0 && st.At.Sub(s.samples[len(s.samples)-1].Timestamp) < minMetricInterval {
		return append([]metricJSON(nil), s.samples...)
	}
	cores := max(float64(st.CPUMillis)/1000, 0.001)
	pct := 0.0
	if dt := st.At.Sub(s.lastAt); dt > 0 && st.CPUNanos >= s.lastCPU {
		pct = float64(st.CPUNanos-s.lastCPU) / float64(dt.Nanoseconds()) / cores * 100
	}
	pct = min(max(pct, 0), 100)
	m := metricJSON{
		Timestamp: st.At.UTC(), TimestampUnix: st.At.Unix(), CPUCount: int((st.CPUMillis + 999) / 1000),
		CPUUsedPct: float64(int64(pct*100)) / 100, MemUsed: st.MemBytes, MemTotal: st.MemLimit,
		DiskUsed: st.DiskBytes, DiskTotal: st.DiskLimit,
	}
	s.samples = append(s.samples, m)
	if len(s.samples) > maxMetricSamples {
		s.samples = append([]metricJSON(nil), s.samples[len(s.samples)-maxMetricSamples:]...)
	}
	s.lastCPU, s.lastAt = st.CPUNanos, st.At
	return append([]metricJSON(nil), s.samples...)
}

// series returns what is recorded for id, without a new reading.
func (h *metricsHistory) series(id string) []metricJSON {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.byID[id]; s != nil {
		return append([]metricJSON(nil), s.samples...)
	}
	return nil
}

func (h *metricsHistory) evictLocked() {
	var oldest string
	var at time.Time
	for id, s := range h.byID {
		if oldest == "" || s.touched.Before(at) {
			oldest, at = id, s.touched
		}
	}
	delete(h.byID, oldest)
}

// inRange keeps the samples with start <= t <= end (unix seconds; zero = open).
func inRange(samples []metricJSON, start, end int64) []metricJSON {
	out := []metricJSON{}
	for _, m := range samples {
		if (start == 0 || m.TimestampUnix >= start) && (end == 0 || m.TimestampUnix <= end) {
			out = append(out, m)
		}
	}
	return out
}

func unixParam(v, field string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, errs.Field(field, "must be a unix time in seconds; got %q", v)
	}
	return n, nil
}

// handleMetrics serves GET /sandboxes/{id}/metrics?start=&end=: the
// readings taken of a running sandbox's cgroup (CPU, memory) and workspace
// (disk) in the range, oldest first. A running sandbox is read now when the
// range reaches the present; a paused one answers what was recorded.
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	start, err := unixParam(q.Get("start"), "start")
	if err == nil {
		var end int64
		if end, err = unixParam(q.Get("end"), "end"); err == nil && end != 0 && end < start {
			err = errs.Field("end", "must not be before start")
		}
		if err == nil {
			s.serveMetrics(w, r, start, end)
			return
		}
	}
	s.writeAPIError(w, r, err)
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request, start, end int64) {
	ctx, owner, id := r.Context(), ownerFrom(r.Context()), r.PathValue("id")
	_, state, err := s.visible(ctx, id)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	samples := s.metrics.series(id)
	if state == "running" && (end == 0 || end >= s.opts.Now().Unix()) {
		st, err := s.d.Admission().SandboxStats(ctx, owner, id)
		if err != nil {
			s.writeAPIError(w, r, err)
			return
		}
		samples = s.metrics.record(id, st)
	}
	writeJSON(w, http.StatusOK, inRange(samples, start, end))
}
