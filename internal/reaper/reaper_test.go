package reaper

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// testPolicy: every signal 1m, disk after 10m, archive after 1h, spin 5m.
func testPolicy() Policy {
	return Policy{Name: "t", ClientIdle: Duration(time.Minute), APIIdle: Duration(time.Minute),
		WriteIdle: Duration(time.Minute), EgressIdle: Duration(time.Minute), CPUIdle: Duration(time.Minute),
		CPUThreshold: 0.05, PauseMode: sandbox.PauseFreeze, DiskAfter: Duration(10 * time.Minute),
		ArchiveAfter: Duration(time.Hour), SpinThreshold: 0.9, SpinWindow: Duration(5 * time.Minute),
		ThrottleCPU: 0.1, SpinPauseAfter: Duration(5 * time.Minute)}
}

func TestDecide(t *testing.T) {
	running := Sandbox{State: sandbox.Running, ExpiryAction: sandbox.ExpireStop, Since: t0}
	pausedFreeze := Sandbox{State: sandbox.Paused, PauseActual: sandbox.PauseFreeze, ExpiryAction: sandbox.ExpireStop, Since: t0}
	pausedDisk := pausedFreeze
	pausedDisk.PauseActual = sandbox.PauseDisk
	withAction := func(sb Sandbox, a sandbox.ExpiryAction) Sandbox { sb.ExpiryAction = a; return sb }
	never := Policy{Name: PolicyNever, Never: true}
	pol := testPolicy()

	for _, tc := range []struct {
		name string
		now  time.Time
		sb   Sandbox
		sig  Signals
		pol  Policy
		want Decision
	}{
		{"fresh sandbox is not idle", at(30 * time.Second), running, Signals{}, pol,
			Decision{Action: None, Reason: "recent:client", IdleFor: 30 * time.Second}},
		{"all quiet past every window pauses in the policy's mode", at(2 * time.Minute), running, Signals{}, pol,
			Decision{Action: Pause, Mode: sandbox.PauseFreeze, Reason: "idle", IdleFor: 2 * time.Minute}},
		{"open client stream keeps it", at(time.Hour), running, Signals{Clients: 1}, pol,
			Decision{Action: None, Reason: "busy:client"}},
		{"active lease keeps it", at(time.Hour), running, Signals{LeaseUntil: at(2 * time.Hour)}, pol,
			Decision{Action: None, Reason: "busy:lease"}},
		{"expired lease does not", at(time.Hour), running, Signals{LeaseUntil: at(time.Minute)}, pol,
			Decision{Action: Pause, Mode: sandbox.PauseFreeze, Reason: "idle", IdleFor: time.Hour}},
		{"in-flight egress request keeps it (a long model call)", at(time.Hour), running, Signals{Egress: 1}, pol,
			Decision{Action: None, Reason: "busy:egress"}},
		{"client left 30s ago: its own window", at(time.Hour), running, Signals{LastClient: at(time.Hour - 30*time.Second)}, pol,
			Decision{Action: None, Reason: "recent:client", IdleFor: 30 * time.Second}},
		{"recent API call", at(time.Hour), running, Signals{LastAPI: at(time.Hour - 59*time.Second)}, pol,
			Decision{Action: None, Reason: "recent:api", IdleFor: 59 * time.Second}},
		{"recent file write", at(time.Hour), running, Signals{LastWrite: at(time.Hour - time.Second)}, pol,
			Decision{Action: None, Reason: "recent:write", IdleFor: time.Second}},
		{"egress finished recently", at(time.Hour), running, Signals{LastEgress: at(time.Hour - time.Second)}, pol,
			Decision{Action: None, Reason: "recent:egress", IdleFor: time.Second}},
		{"cpu above threshold recently", at(time.Hour), running, Signals{LastCPU: at(time.Hour - time.Second), CPU: 0.5}, pol,
			Decision{Action: None, Reason: "recent:cpu", IdleFor: time.Second}},
		{"each window is its own: api window longer", at(2 * time.Minute), running,
			Signals{LastAPI: at(time.Minute)}, func() Policy { p := pol; p.APIIdle = Duration(5 * time.Minute); return p }(),
			Decision{Action: None, Reason: "recent:api", IdleFor: time.Minute}},
		{"idle past disk window while running still only pauses (suspend before kill)", at(2 * time.Hour), running, Signals{}, pol,
			Decision{Action: Pause, Mode: sandbox.PauseFreeze, Reason: "idle", IdleFor: 2 * time.Hour}},
		{"paused, not long enough for disk", at(5 * time.Minute), pausedFreeze, Signals{}, pol,
			Decision{Action: None, Reason: "paused", IdleFor: 5 * time.Minute}},
		{"paused past disk window demotes to disk", at(10 * time.Minute), pausedFreeze, Signals{}, pol,
			Decision{Action: PauseDisk, Reason: "idle_long", IdleFor: 10 * time.Minute}},
		{"disk-paused stays until archive", at(30 * time.Minute), pausedDisk, Signals{}, pol,
			Decision{Action: None, Reason: "paused", IdleFor: 30 * time.Minute}},
		{"archive window stops (expiry action stop)", at(time.Hour), pausedDisk, Signals{}, pol,
			Decision{Action: Stop, Reason: "idle_archive", IdleFor: time.Hour}},
		{"archive window deletes (expiry action delete)", at(time.Hour), withAction(pausedDisk, sandbox.ExpireDelete), Signals{}, pol,
			Decision{Action: Delete, Reason: "idle_archive", IdleFor: time.Hour}},
		{"archive window keeps a workstation paused (expiry action pause)", at(time.Hour), withAction(pausedDisk, sandbox.ExpirePause), Signals{}, pol,
			Decision{Action: None, Reason: "paused", IdleFor: time.Hour}},
		{"leased paused sandbox is left alone", at(time.Hour), pausedFreeze, Signals{LeaseUntil: at(2 * time.Hour)}, pol,
			Decision{Action: None, Reason: "busy:lease"}},
		{"stopped with delete action is deleted after archive", at(2 * time.Hour), withAction(Sandbox{State: sandbox.Stopped, Since: t0}, sandbox.ExpireDelete),
			Signals{LastAPI: at(time.Hour)}, pol, Decision{Action: Delete, Reason: "idle_archive", IdleFor: time.Hour}},
		{"stopped with stop action stays", at(2 * time.Hour), withAction(Sandbox{State: sandbox.Stopped, Since: t0}, sandbox.ExpireStop),
			Signals{}, pol, Decision{Action: None, Reason: "stopped", IdleFor: 2 * time.Hour}},
		{"creating is never touched", at(2 * time.Hour), Sandbox{State: sandbox.Creating, Since: t0}, Signals{}, pol,
			Decision{Action: None, Reason: "state_creating", IdleFor: 2 * time.Hour}},
		{"policy never", at(100 * time.Hour), running, Signals{}, never, Decision{Action: None, Reason: "policy_never"}},
		{"policy never unthrottles", at(100 * time.Hour), running, Signals{ThrottledAt: at(time.Hour)}, never,
			Decision{Action: Unthrottle, Reason: "policy_never"}},
		{"since floors idleness (daemon restart, no history)", at(3 * time.Hour), Sandbox{State: sandbox.Running, Since: at(3*time.Hour - 10*time.Second)}, Signals{}, pol,
			Decision{Action: None, Reason: "recent:client", IdleFor: 10 * time.Second}},

		// CPU-spin detector.
		{"spinning briefly is just busy", at(time.Hour), running,
			Signals{CPU: 1, SpinSince: at(time.Hour - time.Minute), LastCPU: at(time.Hour)}, pol,
			Decision{Action: None, Reason: "recent:cpu"}},
		{"spinning for the window unattended throttles", at(time.Hour), running,
			Signals{CPU: 1, SpinSince: at(time.Hour - 5*time.Minute), LastCPU: at(time.Hour)}, pol,
			Decision{Action: Throttle, Reason: "cpu_spin"}},
		{"spinning with a client attached is left alone", at(time.Hour), running,
			Signals{Clients: 1, CPU: 1, SpinSince: at(0), LastCPU: at(time.Hour)}, pol,
			Decision{Action: None, Reason: "busy:client"}},
		{"spinning with a lease is left alone", at(time.Hour), running,
			Signals{LeaseUntil: at(2 * time.Hour), CPU: 1, SpinSince: at(0), LastCPU: at(time.Hour)}, pol,
			Decision{Action: None, Reason: "busy:lease"}},
		{"throttled and still spinning, not long enough", at(time.Hour), running,
			Signals{CPU: 1, SpinSince: at(0), LastCPU: at(time.Hour), ThrottledAt: at(time.Hour - time.Minute)}, pol,
			Decision{Action: None, Reason: "cpu_spin_throttled"}},
		{"throttled and still spinning long enough pauses", at(time.Hour), running,
			Signals{CPU: 1, SpinSince: at(0), LastCPU: at(time.Hour), ThrottledAt: at(time.Hour - 5*time.Minute)}, pol,
			Decision{Action: Pause, Mode: sandbox.PauseFreeze, Reason: "cpu_spin"}},
		{"throttled sandbox gets a client: unthrottle", at(time.Hour), running,
			Signals{Clients: 1, CPU: 1, SpinSince: at(0), ThrottledAt: at(time.Hour - time.Minute)}, pol,
			Decision{Action: Unthrottle, Reason: "attended"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.now, tc.sb, tc.sig, tc.pol)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLadder walks one abandoned sandbox through the whole ladder with an
// injected clock: pause, then disk, then stop; never a kill while running.
func TestLadder(t *testing.T) {
	pol := testPolicy()
	sb := Sandbox{State: sandbox.Running, ExpiryAction: sandbox.ExpireStop, Since: t0}
	var got []string
	for now := t0; now.Before(at(2 * time.Hour)); now = now.Add(30 * time.Second) {
		d := Decide(now, sb, Signals{}, pol)
		switch d.Action {
		case Pause:
			sb.State, sb.PauseActual = sandbox.Paused, d.Mode
		case PauseDisk:
			sb.PauseActual = sandbox.PauseDisk
		case Stop:
			sb.State = sandbox.Stopped
		case None:
			continue
		default:
			t.Fatalf("unexpected action %s at %s", d.Action, now.Sub(t0))
		}
		got = append(got, string(d.Action)+"@"+now.Sub(t0).String())
	}
	want := []string{"pause@1m0s", "pause-disk@10m0s", "stop@1h0m0s"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ladder (-want +got):\n%s", diff)
	}
}

func TestConfig(t *testing.T) {
	var c Config
	if err := json.Unmarshal([]byte(`{"interval":"1s","default_policy":"fast",
		"template_policies":{"tiny":"never"},
		"policies":{"fast":{"client_idle":"2s","api_idle":"2s","write_idle":"2s","egress_idle":"2s","cpu_idle":"2s",
		"disk_after":"4s","archive_after":"6s","pause_mode":"freeze"}}}`), &c); err != nil {
		t.Fatal(err)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if p := c.Resolve("", "tiny"); !p.Never {
		t.Errorf("template policy: got %+v, want never", p)
	}
	if p := c.Resolve("", "other"); p.Name != "fast" || p.ClientIdle.D() != 2*time.Second || p.SpinThreshold != 0.9 {
		t.Errorf("default policy: got %+v", p)
	}
	if p := c.Resolve("default", "tiny"); p.Name != "default" {
		t.Errorf("sandbox policy wins over template: got %s", p.Name)
	}
	if p := c.Resolve("gone", "other"); p.Name != "fast" {
		t.Errorf("unknown sandbox policy falls back: got %s", p.Name)
	}
	if err := c.CheckName("idle_policy", "nope"); errs.FieldOf(err) != "idle_policy" {
		t.Errorf("CheckName: %v", err)
	}

	for _, tc := range []struct {
		name, js, field string
	}{
		{"disk before idle", `{"policies":{"x":{"client_idle":"1h","disk_after":"1m"}}}`, "reaper.policies.x.disk_after"},
		{"archive before disk", `{"policies":{"x":{"disk_after":"3h","archive_after":"2h"}}}`, "reaper.policies.x.archive_after"},
		{"bad mode", `{"policies":{"x":{"pause_mode":"nap"}}}`, "reaper.policies.x.pause_mode"},
		{"unknown default", `{"default_policy":"x"}`, "reaper.default_policy"},
		{"unknown template policy", `{"template_policies":{"tiny":"x"}}`, "reaper.template_policies.tiny"},
		{"redefine never", `{"policies":{"never":{}}}`, "reaper.policies.never"},
		{"spin below idle threshold", `{"policies":{"x":{"cpu_threshold":0.5,"spin_threshold":0.4}}}`, "reaper.policies.x.spin_threshold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			if err := json.Unmarshal([]byte(tc.js), &c); err != nil {
				t.Fatal(err)
			}
			c.SetDefaults()
			err := c.Validate()
			if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != tc.field {
				t.Errorf("Validate = %v (field %q), want field %q", err, errs.FieldOf(err), tc.field)
			}
		})
	}
}

// Reaper policies read durations in the one grammar TTLs use: "1d" and
// "1d12h" work here too (they did not with time.ParseDuration).
func TestPolicyDurations(t *testing.T) {
	var c Config
	in := `{"interval":"30s","policies":{"night":{"client_idle":"15m","api_idle":"15m","write_idle":"15m",
		"egress_idle":"15m","cpu_idle":"15m","disk_after":"1d","archive_after":"1d12h"}}}`
	if err := json.Unmarshal([]byte(in), &c); err != nil {
		t.Fatal(err)
	}
	p := c.Policies["night"]
	if c.Interval.D() != 30*time.Second || p.DiskAfter.D() != 24*time.Hour || p.ArchiveAfter.D() != 36*time.Hour {
		t.Errorf("interval %v, disk_after %v, archive_after %v", c.Interval, p.DiskAfter, p.ArchiveAfter)
	}
	var te *json.UnmarshalTypeError
	err := json.Unmarshal([]byte(`{"policies":{"x":{"disk_after":"soon"}}}`), &c)
	if !errors.As(err, &te) || te.Field != "policies.disk_after" {
		t.Errorf("a bad duration: %v, want a type error naming policies.disk_after", err)
	}
}
