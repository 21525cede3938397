package leases

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// TestPlan is the credential row of the state table, phase by phase.
func TestPlan(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	lease := func(id string, gen int, secret, ph, state string) store.Lease {
		return store.Lease{ID: id, SandboxID: "sb", Owner: "o", Generation: gen, Secret: secret, Placeholder: ph, State: state}
	}
	refs := []sandbox.SecretGrant{{Name: "TOKEN", Placeholder: "ph-ref"}, {Name: "GH", Placeholder: "ph-gh"}}
	scopes := map[string]Scope{"TOKEN": {"api.test", "Authorization"}, "GH": {"gh.test", "Authorization"}}
	type got struct {
		Set   []string // id:state:reason
		Issue []string // secret:gen:placeholder
	}
	for _, tc := range []struct {
		name   string
		op     Op
		leases []store.Lease
		refs   []sandbox.SecretGrant
		scopes map[string]Scope
		taken  string
		want   got
	}{
		{name: "create: issue generation 1 with the env's placeholders", op: OpEnsure, refs: refs, scopes: scopes,
			want: got{Issue: []string{"TOKEN:1:ph-ref", "GH:1:ph-gh"}}},
		{name: "boot again (restart, start): nothing new", op: OpEnsure, refs: refs, scopes: scopes,
			leases: []store.Lease{lease("a", 1, "TOKEN", "ph-ref", "active"), lease("b", 1, "GH", "ph-gh", "frozen")}},
		{name: "fork child: the parent's placeholder is taken, a fresh one", op: OpEnsure, refs: refs[:1], scopes: scopes, taken: "ph-ref",
			want: got{Issue: []string{"TOKEN:1:new-TOKEN"}}},
		{name: "a deleted secret gets no lease", op: OpEnsure, refs: refs, scopes: map[string]Scope{"GH": scopes["GH"]},
			want: got{Issue: []string{"GH:1:ph-gh"}}},
		{name: "a revoked lease is never revived by ensure", op: OpEnsure, refs: refs[:1], scopes: scopes,
			leases: []store.Lease{lease("a", 2, "TOKEN", "ph-ref", "revoked")}},
		{name: "resume: old revoked, next generation, fresh placeholders", op: OpReissue, refs: refs, scopes: scopes,
			leases: []store.Lease{lease("a", 1, "TOKEN", "ph-ref", "frozen"), lease("b", 1, "GH", "ph-gh", "frozen"), lease("z", 1, "GH", "old", "revoked")},
			want:   got{Set: []string{"a:revoked:resumed", "b:revoked:resumed"}, Issue: []string{"TOKEN:2:new-TOKEN", "GH:2:new-GH"}}},
		{name: "rewind: the same, reason restored", op: OpReissue, refs: refs[:1], scopes: scopes,
			leases: []store.Lease{lease("a", 3, "TOKEN", "p3", "active")},
			want:   got{Set: []string{"a:revoked:restored"}, Issue: []string{"TOKEN:4:new-TOKEN"}}},
		{name: "resume after a withdrawn grant: nothing re-issued for it", op: OpReissue, refs: nil, scopes: scopes,
			leases: []store.Lease{lease("a", 1, "TOKEN", "p1", "revoked")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason := ReasonResumed
			if tc.name[:6] == "rewind" {
				reason = ReasonRestored
			}
			n := 0
			ch := Plan(tc.op, Input{Sandbox: "sb", Owner: "o", Refs: tc.refs, Leases: tc.leases, Scopes: tc.scopes, Now: now, Reason: reason,
				Taken:          func(ph string) bool { return ph == tc.taken },
				NewID:          func() string { n++; return fmt.Sprint("id", n) },
				NewPlaceholder: func(s string) string { return "new-" + s }})
			var g got
			for _, u := range ch.Set {
				g.Set = append(g.Set, u.ID+":"+u.State+":"+u.Reason)
				if !u.At.Equal(now) {
					t.Errorf("update %s at %v, want now", u.ID, u.At)
				}
			}
			for _, l := range ch.Issue {
				g.Issue = append(g.Issue, fmt.Sprintf("%s:%d:%s", l.Secret, l.Generation, l.Placeholder))
				if l.State != store.LeaseActive || l.Host != tc.scopes[l.Secret].Host || l.SandboxID != "sb" || l.Owner != "o" || l.ID == "" {
					t.Errorf("issued %+v", l)
				}
			}
			if d := cmp.Diff(tc.want, g); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestEffectiveAndCurrent(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	ls := []store.Lease{
		{ID: "a", Generation: 1, Secret: "TOKEN", Placeholder: "p1", State: store.LeaseRevoked},
		{ID: "b", Generation: 2, Secret: "TOKEN", Placeholder: "p2", State: store.LeaseActive},
		{ID: "c", Generation: 2, Secret: "GH", Placeholder: "g2", State: store.LeaseActive, ExpiresAt: now},
		{ID: "d", Generation: 2, Secret: "NPM", Placeholder: "n2", State: store.LeaseFrozen},
	}
	for _, tc := range []struct {
		l      store.Lease
		at     time.Time
		paused bool
		want   string
	}{
		{ls[2], now, false, "revoked/expired"},
		{ls[2], now, true, "revoked/expired"}, // expiry wins: it never thaws
		{ls[2], now.Add(-time.Second), false, "active/"},
		{ls[1], now, true, "frozen/paused"},
		{ls[0], now, true, "revoked/resumed"},
	} {
		tc.l.Reason = map[string]string{"a": "resumed"}[tc.l.ID]
		if e := Effective(tc.l, tc.at, tc.paused); e.State+"/"+e.Reason != tc.want {
			t.Errorf("Effective(%s at %v, paused %v) = %s/%s, want %s", tc.l.ID, tc.at, tc.paused, e.State, e.Reason, tc.want)
		}
	}
	for st, want := range map[sandbox.State]bool{sandbox.Creating: false, sandbox.Running: false, sandbox.Pausing: true,
		sandbox.Paused: true, sandbox.Resuming: true, sandbox.Stopped: false} {
		if Paused(st) != want {
			t.Errorf("Paused(%s) = %v", st, !want)
		}
	}
	cur := Current(ls, now)
	if d := cmp.Diff(map[string]string{"TOKEN": "p2", "NPM": "n2"}, cur); d != "" {
		t.Errorf("Current (-want +got):\n%s", d)
	}
	if got := string(EnvFile(cur)); got != "NPM=n2\nTOKEN=p2\n" {
		t.Errorf("EnvFile = %q", got)
	}
}

func TestAfterAndSetPlaceholders(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	ls := []store.Lease{{ID: "a", Generation: 1, Secret: "TOKEN", Placeholder: "p1", State: store.LeaseRevoked, Reason: "resumed"},
		{ID: "b", Generation: 2, Secret: "TOKEN", Placeholder: "p2", State: store.LeaseActive}}
	after := After(ls, Change{Set: []store.LeaseUpdate{{ID: "a", State: store.LeaseActive}, {ID: "b", State: store.LeaseRevoked, Reason: "resumed", At: now}},
		Issue: []store.Lease{{ID: "c", Generation: 3, Secret: "TOKEN", Placeholder: "p3", State: store.LeaseActive}}})
	if after[0].State != store.LeaseRevoked || after[1].State != store.LeaseRevoked || len(after) != 3 || ls[1].State != store.LeaseActive {
		t.Errorf("After = %+v (input %+v)", after, ls)
	}
	sb := &sandbox.Sandbox{Env: map[string]string{"TOKEN": "p2", "GH": "g1"},
		Attrs: sandbox.Attrs{Net: sandbox.NetState{Secrets: []sandbox.SecretGrant{{Name: "TOKEN", Placeholder: "p2"}, {Name: "GH", Placeholder: "g1"}}}}}
	if !SetPlaceholders(sb, Current(after, now), "") || sb.Env["TOKEN"] != "p3" || sb.Net.Secrets[0].Placeholder != "p3" || sb.Env["GH"] != "g1" {
		t.Errorf("SetPlaceholders: env %v grants %v", sb.Env, sb.Net.Secrets)
	}
	if SetPlaceholders(sb, Current(after, now), "") {
		t.Errorf("a second SetPlaceholders changed something")
	}
	if !SetPlaceholders(sb, map[string]string{}, "GH") || len(sb.Net.Secrets) != 1 || sb.Net.Secrets[0].Name != "TOKEN" {
		t.Errorf("withdraw GH: grants %v", sb.Net.Secrets)
	}
}
