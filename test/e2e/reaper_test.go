package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testutil"
)

// reaperConfig compresses the reaper's windows to seconds. The "fast"
// policy is the server default; "spin" adds a quick CPU-spin detector.
const reaperConfig = `{
  "reaper": {
    "interval": "500ms",
    "default_policy": "fast",
    "policies": {
      "fast": {"client_idle": "3s", "api_idle": "3s", "write_idle": "3s", "egress_idle": "3s", "cpu_idle": "3s",
               "pause_mode": "freeze", "disk_after": "7s", "archive_after": "11s"},
      "spin": {"client_idle": "2s", "api_idle": "2s", "write_idle": "2s", "egress_idle": "2s", "cpu_idle": "2s",
               "pause_mode": "freeze", "disk_after": "1h", "archive_after": "2h",
               "spin_threshold": 0.6, "spin_window": "3s", "throttle_cpu": 0.1, "spin_pause_after": "4s"}
    }
  },
  "prices": {"currency": "USD", "vcpu_hour": 3.6, "memory_gib_hour": 0.36, "disk_gib_hour": 0.036}
}`

func startReaperServer(t *testing.T) *server {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "berth.json")
	if err := os.WriteFile(cfg, []byte(reaperConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return startServer(t, "--config", cfg)
}

type rpSandbox struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	PauseMode string            `json:"pause_mode"`
	Reason    string            `json:"reason"`
	Extra     map[string]string `json:"extra"`
}

// inspect reads a sandbox without touching it: GET /v1/sandboxes/{id}
// does not count as activity for the reaper.
func (s *server) rpInspect(id string) rpSandbox {
	s.t.Helper()
	out := s.must("inspect", id)
	var v rpSandbox
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		s.t.Fatalf("inspect %s: %v: %s", id, err, out)
	}
	return v
}

type rpEvent struct {
	Actor  string            `json:"actor"`
	Type   string            `json:"type"`
	Reason string            `json:"reason"`
	To     string            `json:"to"`
	Data   map[string]string `json:"data"`
}

func (s *server) rpEvents(id string) []rpEvent {
	s.t.Helper()
	var evs []rpEvent
	out := s.must("events", id, "--json")
	if err := json.Unmarshal([]byte(out), &evs); err != nil {
		s.t.Fatalf("events %s: %v: %s", id, err, out)
	}
	return evs
}

// rpWaitFor polls cond every 250ms until it holds or the deadline passes.
func rpWaitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, testutil.Within(limit).Every(250*time.Millisecond),
		testutil.True(cond, func() string { return "waiting for " + what }))
}

// TestReaperLadder: an abandoned sandbox is paused (freeze), then paused to
// disk, then stopped (its expiry action), each step an event carrying the
// signals; a sandbox with a lease and one with an open exec stream are
// left alone throughout. (In-flight egress is covered in-process by
// internal/admission's TestReaperRound through Service.NoteEgress: the egress
// proxy does not feed the hook yet.)
func TestReaperLadder(t *testing.T) {
	s := startReaperServer(t)
	idle := s.create()
	leased := s.create()
	streaming := s.create()
	s.must("lease", leased, "--for", "1h")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := exec.CommandContext(ctx, filepath.Join(s.bin, "berth"), "exec", streaming, "--", "sleep", "60")
	stream.Env = s.env(s.key)
	if err := stream.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = stream.Wait() }()

	seen := map[string]bool{}
	rpWaitFor(t, 45*time.Second, "idle sandbox to be paused, paused to disk, then stopped", func() bool {
		v := s.rpInspect(idle)
		switch {
		case v.State == "paused" && v.PauseMode == "freeze":
			seen["freeze"] = true
		case v.State == "paused" && v.PauseMode == "disk":
			seen["disk"] = true
		}
		return v.State == "stopped"
	})
	for _, st := range []string{leased, streaming} {
		if v := s.rpInspect(st); v.State != "running" {
			t.Errorf("sandbox %s (lease or open stream) is %s, want running", st, v.State)
		}
	}
	var actions []string
	for _, ev := range s.rpEvents(idle) {
		if ev.Type == "reaper" {
			actions = append(actions, ev.Data["action"]+":"+ev.Reason)
			if ev.Data["clients"] != "0" || ev.Data["last_api_ago"] == "" || ev.Data["policy"] != "fast" {
				t.Errorf("reaper event without its signals: %+v", ev)
			}
		}
	}
	want := "pause:idle,pause-disk:idle_long,stop:idle_archive"
	if got := strings.Join(actions, ","); got != want {
		t.Errorf("reaper actions = %s, want %s (states seen %v)", got, want, seen)
	}
	for _, st := range []string{leased, streaming} {
		for _, ev := range s.rpEvents(st) {
			if ev.Actor == "reaper" || ev.Type == "reaper" {
				t.Errorf("sandbox %s was touched by the reaper: %+v", st, ev)
			}
		}
	}
	// Policy "never" and an unknown policy.
	never := s.create("--idle-policy", "never")
	if out, code := s.run("create", "--template", "tiny", "--idle-policy", "nope"); code != 2 || !strings.Contains(out, "idle_policy") {
		t.Errorf("create --idle-policy nope: exit %d: %s", code, out)
	}
	time.Sleep(5 * time.Second)
	if v := s.rpInspect(never); v.State != "running" {
		t.Errorf("idle-policy never: sandbox is %s", v.State)
	}
}

// TestMeteringCPU burns 2 CPU-seconds in a sandbox and checks the metered
// CPU-seconds (cgroup cpuacct) within ±25%, and that both cost bases show.
func TestMeteringCPU(t *testing.T) {
	s := startReaperServer(t)
	id := s.create("--idle-policy", "never", "--cpu", "1")
	time.Sleep(1500 * time.Millisecond) // a baseline sample
	base := rpUsageOf(t, s, id)
	// Spin until the shell itself has used 2 CPU-seconds (utime+stime in
	// /proc/self/stat, 100 ticks/s), so a busy host cannot stretch it: on 2
	// shared cores a wall-clock spin is not a CPU-second spin.
	s.must("exec", id, "--", "sh", "-c",
		`while :; do read -r a b c d e f g h i j k l m ut st rest < /proc/$$/stat; [ $((ut+st)) -ge 200 ] && break; done`)
	time.Sleep(1500 * time.Millisecond)
	got := rpUsageOf(t, s, id)
	burned := got.CPUSeconds - base.CPUSeconds
	if burned < 2*0.75 || burned > 2*1.25 {
		t.Errorf("metered CPU for a 2 CPU-second spin = %.2f CPU-seconds, want 2 ±25%%", burned)
	}
	if got.RunningSeconds < 3 || got.MemPeakMiB <= 0 || got.CostReserved <= 0 || got.CostActive <= 0 {
		t.Errorf("usage line incomplete: %+v", got)
	}
	t.Logf("burned %.2f CPU-s; running %.1fs; reserved cost %.5f vs active %.5f", burned, got.RunningSeconds, got.CostReserved, got.CostActive)
	out := s.must("usage", "--sandboxes")
	if !strings.Contains(out, id) || !strings.Contains(out, "RESERVED USD") {
		t.Errorf("berth usage --sandboxes:\n%s", out)
	}
	code, body := s.api(s.key, "GET", "/v1/usage?since=bogus", nil)
	if code != http.StatusBadRequest || body["field"] != "since" {
		t.Errorf("GET /v1/usage?since=bogus = %d %v", code, body)
	}
	// Metrics: admin only, text format, with the families we document.
	req, _ := http.NewRequest("GET", s.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	resp.Body.Close()
	for _, want := range []string{`berth_sandboxes{state="running",owner="admin"} 1`, "berth_sandbox_create_seconds_bucket", `berth_usage_cpu_seconds_total{owner="admin"}`} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, sb.String())
		}
	}
	if code, _ := s.api("", "GET", "/metrics", nil); code != http.StatusUnauthorized {
		t.Errorf("/metrics without a key = %d, want 401", code)
	}
}

type rpUsage struct {
	SandboxID      string  `json:"sandbox_id"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	RunningSeconds float64 `json:"running_seconds"`
	MemPeakMiB     float64 `json:"memory_peak_mib"`
	CostReserved   float64 `json:"cost_reserved"`
	CostActive     float64 `json:"cost_active"`
}

func rpUsageOf(t *testing.T, s *server, id string) rpUsage {
	t.Helper()
	var rep struct {
		Sandboxes []rpUsage `json:"sandboxes"`
	}
	out := s.must("usage", "--sandbox", id, "--json")
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Sandboxes) != 1 {
		t.Fatalf("usage --json: %v: %s", err, out)
	}
	return rep.Sandboxes[0]
}

// TestQuotaConcurrentCreates: with a limit of 3 concurrent sandboxes, 10
// parallel creates give exactly 3 sandboxes and 7 × 429 naming the limit,
// and nothing of the refused ones is left anywhere.
func TestQuotaConcurrentCreates(t *testing.T) {
	s := startReaperServer(t)
	s.must("quota", "set", "alice", "--sandboxes", "3", "--memory", "4096")
	code, body := s.api(s.key, "POST", "/v1/keys", map[string]any{"owner": "alice"})
	if code != http.StatusCreated {
		t.Fatalf("key: %d %v", code, body)
	}
	alice := body["key"].(string)
	var wg sync.WaitGroup
	codes := make([]int, 10)
	bodies := make([]map[string]any, 10)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], bodies[i] = s.api(alice, "POST", "/v1/sandboxes", map[string]any{"template": "tiny", "idle_policy": "never"})
		}()
	}
	wg.Wait()
	ok, refused := 0, 0
	for i, c := range codes {
		switch c {
		case http.StatusCreated:
			ok++
		case http.StatusTooManyRequests:
			refused++
			if bodies[i]["field"] != "sandboxes" || !strings.Contains(fmt.Sprint(bodies[i]["message"]), "limit sandboxes is 3") {
				t.Errorf("429 body does not name the limit: %v", bodies[i])
			}
		default:
			t.Errorf("create: %d %v", c, bodies[i])
		}
	}
	if ok != 3 || refused != 7 {
		t.Fatalf("created %d, refused %d; want 3 and 7", ok, refused)
	}
	out := s.must("ls", "--owner", "alice", "--json")
	var list []rpSandbox
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 3 {
		t.Fatalf("alice has %d sandboxes (want 3): %v %s", len(list), err, out)
	}
	entries, _ := os.ReadDir(filepath.Join(s.dataDir, "sandboxes"))
	if len(entries) != 3 {
		t.Errorf("%d sandbox dirs on disk, want 3", len(entries))
	}
	// Events: only the three admitted sandboxes have any.
	code, evBody := s.rpAPIList(s.key, "/v1/events?owner=alice")
	ids := map[string]bool{}
	for _, ev := range evBody {
		ids[fmt.Sprint(ev["sandbox_id"])] = true
	}
	if code != http.StatusOK || len(ids) != 3 {
		t.Errorf("events of alice name %d sandboxes, want 3", len(ids))
	}
	// Memory quota: a 4 GiB ask is refused naming memory_mib; stopping one frees room.
	s.must("quota", "set", "alice", "--sandboxes", "4", "--memory", "2048")
	c, b := s.api(alice, "POST", "/v1/sandboxes", map[string]any{"template": "tiny", "memory_mib": 1024})
	if c != http.StatusTooManyRequests || b["field"] != "memory_mib" {
		t.Errorf("memory quota: %d %v", c, b)
	}
	out = s.must("quota", "get", "alice")
	if !strings.Contains(out, "3/4") || !strings.Contains(out, "stored") {
		t.Errorf("quota get:\n%s", out)
	}
	if code, _ := s.api(alice, "PUT", "/v1/quotas/alice", map[string]any{"sandboxes": 100}); code != http.StatusForbidden {
		t.Errorf("owner raising its own quota = %d, want 403", code)
	}
	if code, b := s.api(s.key, "PUT", "/v1/quotas/alice", map[string]any{"cpu": -1}); code != http.StatusBadRequest || b["field"] != "cpu" {
		t.Errorf("negative quota = %d %v", code, b)
	}
	// Snapshot quota: one allowed, the second is 429 naming snapshots.
	s.must("quota", "set", "alice", "--sandboxes", "4", "--snapshots", "1")
	victim := list[0].ID
	if c, b := s.api(alice, "POST", "/v1/sandboxes/"+victim+"/snapshot", map[string]any{}); c/100 != 2 {
		t.Fatalf("first snapshot: %d %v", c, b)
	}
	if c, b := s.api(alice, "POST", "/v1/sandboxes/"+victim+"/snapshot", map[string]any{}); c != http.StatusTooManyRequests || b["field"] != "snapshots" {
		t.Errorf("second snapshot over a limit of 1: %d %v", c, b)
	}
	// The orphans report runs (nothing is 1 day old here) and knows the templates.
	rep := s.must("report", "orphans", "--days", "0", "--json")
	if !strings.Contains(rep, `"kind": "sandbox"`) || !strings.Contains(rep, `"kind": "template"`) || !strings.Contains(rep, `"kind": "snapshot"`) {
		t.Errorf("report orphans --days 0:\n%s", rep)
	}
}

func (s *server) rpAPIList(key, path string) (int, []map[string]any) {
	s.t.Helper()
	req, _ := http.NewRequest("GET", s.url+path, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestCPUSpinDetector: a sandbox pinning its CPU with no client and no lease
// is throttled (its CFS quota lowered), then paused, with events.
func TestCPUSpinDetector(t *testing.T) {
	s := startReaperServer(t)
	// A small CPU share makes the quota, not a busy host, the bottleneck.
	id := s.create("--idle-policy", "spin", "--cpu", "0.25")
	// A detached spinner: the exec stream ends at once, so no client stays.
	s.must("exec", id, "--", "sh", "-c", "sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &")
	quotaFile := filepath.Join("/sys/fs/cgroup/cpu/berth", id, "cpu.cfs_quota_us")
	var throttledQuota string
	rpWaitFor(t, 30*time.Second, "the spinning sandbox to be throttled then paused", func() bool {
		if b, err := os.ReadFile(quotaFile); err == nil && strings.TrimSpace(string(b)) == "10000" {
			throttledQuota = "10000"
		}
		return s.rpInspect(id).State == "paused"
	})
	var actions []string
	for _, ev := range s.rpEvents(id) {
		if ev.Type == "reaper" {
			actions = append(actions, ev.Data["action"]+":"+ev.Reason)
		}
	}
	if got := strings.Join(actions, ","); got != "throttle:cpu_spin,pause:cpu_spin" {
		t.Errorf("reaper actions = %s, want throttle:cpu_spin,pause:cpu_spin", got)
	}
	if throttledQuota == "" {
		t.Errorf("never saw the throttled CFS quota (10000us of 100000us) in %s", quotaFile)
	}
}
