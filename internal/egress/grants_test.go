package egress

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDecideGrants is the proxy's lease decision per lifecycle phase: what
// a request presenting (or not) a placeholder gets injected.
func TestDecideGrants(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	g := func(lease, state, ph string) Grant {
		return Grant{Name: "TOKEN", Host: "api.test", HeaderTemplate: "Authorization: Bearer {{value}}", Value: "real",
			Placeholder: ph, Lease: lease, State: state}
	}
	ph1, ph2, other := NewPlaceholder("TOKEN"), NewPlaceholder("TOKEN"), NewPlaceholder("TOKEN")
	gh := Grant{Name: "GH", Host: "api.test", HeaderTemplate: "X-GH: {{value}}", Value: "gh", Placeholder: NewPlaceholder("GH"), Lease: "lg"}
	expired := g("l2", GrantActive, ph2)
	expired.Expires = now
	bearer := func(ph string) http.Header { return http.Header{"Authorization": {"Bearer " + ph}} }
	for _, tc := range []struct {
		name    string
		grants  []Grant
		target  string
		h       http.Header
		inject  []string // leases
		verdict []string // verdict:lease
	}{
		{"running, nothing presented", []Grant{g("l1", GrantActive, ph1)}, "/", nil, []string{"l1"}, nil},
		{"running, own placeholder", []Grant{g("l1", GrantActive, ph1)}, "/", bearer(ph1), []string{"l1"}, nil},
		{"own placeholder upper-cased", []Grant{g("l1", GrantActive, ph1)}, "/", bearer(strings.ToUpper(ph1)), []string{"l1"}, nil},
		{"paused (frozen), nothing presented", []Grant{g("l1", GrantFrozen, ph1)}, "/", nil, nil, []string{"lease_frozen:l1"}},
		{"paused (frozen), its placeholder", []Grant{g("l1", GrantFrozen, ph1)}, "/", bearer(ph1), nil, []string{"lease_frozen:l1"}},
		{"resumed, new placeholder", []Grant{g("l1", GrantRevoked, ph1), g("l2", GrantActive, ph2)}, "/", bearer(ph2), []string{"l2"}, nil},
		{"resumed, old placeholder", []Grant{g("l1", GrantRevoked, ph1), g("l2", GrantActive, ph2)}, "/", bearer(ph1), nil, []string{"lease_revoked:l1"}},
		{"old placeholder in the query", []Grant{g("l1", GrantRevoked, ph1), g("l2", GrantActive, ph2)}, "/x?t=" + ph1, nil, nil, []string{"lease_revoked:l1"}},
		{"old placeholder in another header", []Grant{g("l1", GrantRevoked, ph1), g("l2", GrantActive, ph2)}, "/", http.Header{"X-Key": {ph1}}, nil, []string{"lease_revoked:l1"}},
		{"fork child, parent's placeholder", []Grant{g("c1", GrantActive, ph2)}, "/", bearer(other), nil, []string{"lease_revoked:c1"}},
		{"new and old both presented", []Grant{g("l1", GrantRevoked, ph1), g("l2", GrantActive, ph2)}, "/", http.Header{"Authorization": {"Bearer " + ph2}, "X-Key": {ph1}}, nil, []string{"lease_revoked:l1"}},
		{"revoked over the API", []Grant{g("l1", GrantRevoked, ph1)}, "/", nil, nil, []string{"lease_revoked:l1"}},
		{"expired", []Grant{expired}, "/", bearer(ph2), nil, []string{"lease_revoked:l2"}},
		{"truncated placeholder is not one", []Grant{g("l1", GrantActive, ph1)}, "/", bearer(ph1[:len(ph1)-3]), []string{"l1"}, nil},
		{"another secret's placeholder does not count", []Grant{g("l1", GrantActive, ph1), gh}, "/", bearer(NewPlaceholder("GH")), []string{"l1"}, []string{"lease_revoked:lg"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inject, refused := DecideGrants(now, tc.grants, tc.target, tc.h)
			var gotI, gotV []string
			for _, x := range inject {
				gotI = append(gotI, x.Lease)
			}
			for _, r := range refused {
				gotV = append(gotV, r.Verdict+":"+r.Grant.Lease)
				if r.Reason == "" {
					t.Errorf("refusal of %s without a reason", r.Grant.Lease)
				}
			}
			if d := cmp.Diff(tc.inject, gotI); d != "" {
				t.Errorf("injected (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.verdict, gotV); d != "" {
				t.Errorf("refused (-want +got):\n%s", d)
			}
		})
	}
}

// TestInjectGrantsRefused: a refused grant's header is never set, the
// placeholder reaches the server as the sandbox sent it, and the refusal is
// reported.
func TestInjectGrantsRefused(t *testing.T) {
	old, cur := NewPlaceholder("TOKEN"), NewPlaceholder("TOKEN")
	mk := func(ph, state string) Grant {
		return Grant{Name: "TOKEN", Host: "api.test", HeaderTemplate: "Authorization: Bearer {{value}}", Value: "real-value",
			Placeholder: ph, Lease: ph[len(ph)-4:], State: state}
	}
	var got []string
	gs := []Grant{mk(old, GrantRevoked), mk(cur, GrantActive)}
	for i := range gs {
		gs[i].refuse = func(v, r string) { got = append(got, v) }
	}
	req, _ := http.NewRequest("GET", "https://api.test/", nil)
	req.Header.Set("Authorization", "Bearer "+old)
	if n := injectGrants(req, gs); len(n) != 0 {
		t.Errorf("injected %d grants for an old placeholder", len(n))
	}
	if h := req.Header.Get("Authorization"); h != "Bearer "+old {
		t.Errorf("Authorization = %q, want the old placeholder unreplaced", h)
	}
	if len(got) != 1 || got[0] != VerdictLeaseRevoked {
		t.Errorf("refusals reported: %v", got)
	}
	req.Header.Set("Authorization", "Bearer "+cur)
	if n := injectGrants(req, gs); len(n) != 1 || req.Header.Get("Authorization") != "Bearer real-value" {
		t.Errorf("current placeholder: injected %d, header %q", len(n), req.Header.Get("Authorization"))
	}
}

// TestFreezeGrants: a pause freezes the proxy's grants of that sandbox at
// once (a request that sneaks out gets nothing injected), and only its.
func TestFreezeGrants(t *testing.T) {
	ca, err := LoadOrCreateCA(t.TempDir())
	must(t, err)
	px, err := New(Config{ProxyAddr: netip.MustParseAddrPort("127.0.0.1:1"), DNSAddr: netip.MustParseAddrPort("127.0.0.1:1"), CA: ca})
	must(t, err)
	for i, id := range []string{"fa", "fb"} {
		must(t, px.SetSandbox(id, netip.AddrFrom4([4]byte{10, 88, 0, byte(2 + i)}), mustPolicy(t, Rules, []string{"api.test"}, nil)))
		must(t, px.SetGrants(id, []Grant{{Name: "TOKEN", Host: "api.test", HeaderTemplate: "Authorization: Bearer {{value}}",
			Value: "real-" + id, Placeholder: NewPlaceholder("TOKEN"), Lease: "l" + id}}))
	}
	before := px.grantsFor(px.byID["fa"], "api.test")
	px.FreezeGrants("fa")
	px.FreezeGrants("nope") // unknown: nothing happens
	got := px.grantsFor(px.byID["fa"], "api.test")
	if len(got) != 1 || got[0].State != GrantFrozen || got[0].Value != "" {
		t.Fatalf("after FreezeGrants: %+v", got)
	}
	if before[0].State != GrantActive {
		t.Errorf("a request in flight saw its grants change: %+v", before)
	}
	req, _ := http.NewRequest("GET", "https://api.test/", nil)
	if inj := injectGrants(req, got); len(inj) != 0 || req.Header.Get("Authorization") != "" {
		t.Errorf("a frozen grant was injected: %v %q", inj, req.Header.Get("Authorization"))
	}
	if other := px.grantsFor(px.byID["fb"], "api.test"); len(other) != 1 || other[0].State != GrantActive {
		t.Errorf("another sandbox's grants changed: %+v", other)
	}
}
