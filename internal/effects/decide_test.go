package effects

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/store"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestDecide(t *testing.T) {
	done := func(id, sb string, at time.Duration) Prior {
		return Prior{ID: id, SandboxID: sb, Host: "api.test", State: store.EffectCompleted, Status: 201, Replayable: true, StartedAt: t0.Add(at)}
	}
	big := done("big", "parent", time.Second)
	big.Replayable = false
	unknown := done("unk", "parent", time.Second)
	unknown.State = store.EffectUnknown
	stale := done("stale", "parent", time.Second)
	stale.State = store.EffectPending // its daemon died: not in flight
	live := stale
	live.ID, live.InFlight = "live", true
	withdrawn := done("wd", "parent", 2*time.Second)
	withdrawn.State, withdrawn.Replayable = store.EffectWithdrawn, false
	other := done("otherhost", "parent", time.Second)
	other.Host = "elsewhere.test"
	undo := []store.RestoreWindow{{PointAt: t0, At: t0.Add(time.Hour)}}
	for _, tc := range []struct {
		name   string
		req    Request
		priors []Prior
		want   Action
		prior  string
		msg    string
	}{
		{"no prior: sent", Request{SandboxID: "a", Host: "api.test", Keyed: true}, nil, Send, "", ""},
		{"fork repeats the parent's key: replayed", Request{SandboxID: "child", Host: "api.test", Keyed: true}, []Prior{done("p1", "parent", time.Second)}, Replay, "p1", ""},
		{"same sandbox, same key (a retry): replayed", Request{SandboxID: "parent", Host: "api.test", Keyed: true}, []Prior{done("p1", "parent", time.Second)}, Replay, "p1", ""},
		{"repeat: refuse", Request{SandboxID: "child", Host: "api.test", Keyed: true, Repeat: egress.RepeatRefuse}, []Prior{done("p1", "parent", time.Second)}, Refuse, "p1", "repeat: refuse"},
		{"answer too large to replay: refused", Request{SandboxID: "child", Host: "api.test", Keyed: true}, []Prior{big}, Refuse, "big", "too large"},
		{"outcome unknown: refused", Request{SandboxID: "child", Host: "api.test", Keyed: true}, []Prior{unknown}, Refuse, "unk", "unknown"},
		{"pending of a dead daemon counts as unknown", Request{SandboxID: "child", Host: "api.test", Keyed: true}, []Prior{stale}, Refuse, "stale", "unknown"},
		{"withdrawn (never sent): sent", Request{SandboxID: "child", Host: "api.test", Keyed: true}, []Prior{withdrawn}, Send, "", ""},
		{"withdrawn is skipped, an older completed one answers", Request{SandboxID: "child", Host: "api.test", Keyed: true}, []Prior{withdrawn, done("p1", "parent", time.Second)}, Replay, "p1", ""},
		{"in flight: refused", Request{SandboxID: "child", Host: "api.test", Keyed: true}, []Prior{live}, Refuse, "live", "being sent"},
		{"same key to another host: not a repeat", Request{SandboxID: "child", Host: "api.test", Keyed: true}, []Prior{other}, Send, "", ""},
		{"keyless, same sandbox, same timeline: a new effect", Request{SandboxID: "parent", Host: "api.test"}, []Prior{done("p1", "parent", time.Second)}, Send, "", ""},
		{"keyless, fork: replayed", Request{SandboxID: "child", Host: "api.test"}, []Prior{done("p1", "parent", time.Second)}, Replay, "p1", ""},
		{"keyless, own effect undone by a rewind: replayed", Request{SandboxID: "parent", Host: "api.test", Windows: undo}, []Prior{done("p1", "parent", time.Second)}, Replay, "p1", ""},
		{"keyless, own effect before the rewind point: a new effect", Request{SandboxID: "parent", Host: "api.test", Windows: undo}, []Prior{done("p0", "parent", -time.Second)}, Send, "", ""},
		{"keyless, own effect after the rewind: a new effect", Request{SandboxID: "parent", Host: "api.test", Windows: undo}, []Prior{done("p2", "parent", 2*time.Hour)}, Send, "", ""},
		{"newest qualifying prior wins", Request{SandboxID: "parent", Host: "api.test", Windows: undo}, []Prior{done("p2", "parent", 2*time.Hour), done("p1", "parent", time.Second)}, Replay, "p1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.req, tc.priors)
			if got.Action != tc.want {
				t.Fatalf("Decide = %v (%s), want %v", got.Action, got.Message, tc.want)
			}
			if tc.prior != "" && (got.Prior == nil || got.Prior.ID != tc.prior) {
				t.Fatalf("matched %+v, want %s", got.Prior, tc.prior)
			}
			if tc.want == Refuse && (got.Status != http.StatusConflict || !strings.Contains(got.Message, tc.msg)) {
				t.Fatalf("refusal %d %q, want 409 mentioning %q", got.Status, got.Message, tc.msg)
			}
		})
	}
}

func TestIdentityAndDerivedKey(t *testing.T) {
	base := Identity("root", "step-1", "POST", "api.test", "/send", "abc")
	for name, other := range map[string]string{
		"lineage": Identity("root2", "step-1", "POST", "api.test", "/send", "abc"),
		"step":    Identity("root", "step-2", "POST", "api.test", "/send", "abc"),
		"method":  Identity("root", "step-1", "PUT", "api.test", "/send", "abc"),
		"host":    Identity("root", "step-1", "POST", "api2.test", "/send", "abc"),
		"path":    Identity("root", "step-1", "POST", "api.test", "/send2", "abc"),
		"body":    Identity("root", "step-1", "POST", "api.test", "/send", "abd"),
		// Length-prefixed: moving a byte between fields changes the identity.
		"field boundary": Identity("roo", "tstep-1", "POST", "api.test", "/send", "abc"),
	} {
		if other == base {
			t.Errorf("changing the %s does not change the identity", name)
		}
	}
	if Identity("root", "step-1", "POST", "api.test", "/send", "abc") != base {
		t.Fatal("identity is not stable")
	}
	k := DeriveKey(base)
	if k != DeriveKey(base) || !strings.HasPrefix(k, "berth-") || len(k) != 38 {
		t.Fatalf("derived key %q: want stable berth-<32 hex>", k)
	}
}

func TestUndone(t *testing.T) {
	w := []store.RestoreWindow{{PointAt: t0, At: t0.Add(time.Minute)}}
	for at, want := range map[time.Duration]bool{-time.Second: false, 0: false, time.Second: true, time.Minute: true, time.Hour: false} {
		if got := Undone(w, t0.Add(at)); got != want {
			t.Errorf("Undone(t0%+v) = %v, want %v", at, got, want)
		}
	}
}
