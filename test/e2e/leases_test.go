package e2e

import (
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bench"
	"github.com/berth-dev/berth/internal/testutil"
)

// leaseView mirrors wire.Lease (the JSON of `berth secret leases --json`).
type leaseView struct {
	ID          string `json:"id"`
	SandboxID   string `json:"sandbox_id"`
	Generation  int    `json:"generation"`
	Secret      string `json:"secret"`
	Host        string `json:"host"`
	Placeholder string `json:"placeholder"`
	State       string `json:"state"`
	Reason      string `json:"reason"`
}

func (s *server) leases(key string, args ...string) ([]leaseView, string, int) {
	s.t.Helper()
	out, code := s.runAs(key, nil, append([]string{"secret", "leases", "--json"}, args...)...)
	var ls []leaseView
	if code == 0 {
		if err := json.Unmarshal([]byte(out), &ls); err != nil {
			s.t.Fatalf("secret leases: %v\n%s", err, out)
		}
	}
	return ls, out, code
}

// liveLease is a sandbox's one non-revoked lease of TOKEN.
func (s *server) liveLease(id string) leaseView {
	s.t.Helper()
	ls, out, code := s.leases(s.key, id)
	var live []leaseView
	for _, l := range ls {
		if l.State != "revoked" {
			live = append(live, l)
		}
	}
	if code != 0 || len(live) != 1 {
		s.t.Fatalf("leases of %s: want one live lease, got %+v (%s)", id, ls, out)
	}
	return live[0]
}

// leaseLogEntry is an egress log entry with its reason.
type leaseLogEntry struct {
	Host    string `json:"host"`
	Verdict string `json:"verdict"`
	Rule    string `json:"rule"`
	Reason  string `json:"reason"`
}

func (s *server) waitLeaseVerdict(id, verdict string) bool {
	s.t.Helper()
	err := testutil.Within(5 * time.Second).Every(100 * time.Millisecond).Until(func() error {
		var es []leaseLogEntry
		_ = json.Unmarshal([]byte(s.must("net", "log", id, "--json")), &es)
		for _, e := range es {
			if e.Verdict == verdict && e.Host == "secret.test" && e.Rule == "secret:TOKEN" && e.Reason != "" {
				return nil
			}
		}
		return errNoEntry
	})
	return err == nil
}

// TestLeases: issue 17's credential row, on runc and runsc, against the test
// internet's HTTPS server, which reports whether the bearer token it saw
// was the real one ("auth=real") or a placeholder (refused by the server):
// resume re-issues (the old placeholder is refused, the new works), a fork's
// child and its parent cannot use each other's placeholders, a sandbox
// created from an old snapshot cannot use the placeholders in its files, a
// revoke over REST stops injection at once, another owner cannot list or
// revoke, and a daemon restart keeps every lease's state.
func TestLeases(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	if out, code := s.runAs(s.key, strings.NewReader(testToken+"\n"), "secret", "set", "TOKEN", "--host", "secret.test"); code != 0 {
		t.Fatalf("secret set: %s", out)
	}
	bob := strings.TrimSpace(s.must("key", "create", "--owner", "bob"))
	envTok := func(id string) string {
		return s.must("exec", id, "--", "sh", "-c", `printf %s "$TOKEN"`)
	}
	with := func(id, ph string) string { // what secret.test saw for a request presenting ph
		out, _ := s.fetchTLS(id, "https://secret.test/", "Authorization: Bearer "+ph)
		return out
	}
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" && !strings.Contains(s.must("info"), "runsc") {
				testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
			}
			a := s.create("--runtime", rt, "--secret", "TOKEN", "--disk", "64")
			s.installFetch(a, inet)
			l1 := s.liveLease(a)
			ph1 := envTok(a)
			if l1.Generation != 1 || l1.State != "active" || l1.Placeholder != ph1 || l1.Host != "secret.test" || !strings.HasPrefix(ph1, "berth-secret-token-") {
				t.Fatalf("first lease %+v, env TOKEN=%q", l1, ph1)
			}
			if got := with(a, ph1); !strings.Contains(got, "auth=real") {
				t.Fatalf("generation 1 with its own placeholder: secret.test saw %q", got)
			}
			s.must("exec", a, "--", "sh", "-c", `printf %s "$TOKEN" > /home/user/old`)

			// Pause freezes, resume re-issues.
			s.must("pause", a, "--mode", "freeze")
			if l := s.liveLease(a); l.State != "frozen" || l.ID != l1.ID {
				t.Errorf("paused: lease %+v, want %s frozen", l, l1.ID)
			}
			s.must("resume", a)
			l2 := s.liveLease(a)
			ph2 := envTok(a)
			if l2.Generation != 2 || l2.State != "active" || l2.Placeholder == ph1 || ph2 != l2.Placeholder {
				t.Fatalf("resumed: lease %+v, env TOKEN=%q (old %q)", l2, ph2, ph1)
			}
			if all, _, _ := s.leases(s.key, a); len(all) != 2 || all[0].ID != l1.ID || all[0].State != "revoked" || all[0].Reason != "resumed" {
				t.Errorf("after resume the first lease is %+v, want revoked (resumed)", all)
			}
			if f := s.must("exec", a, "--", "cat", "/run/berth/leases.env"); f != "TOKEN="+ph2 {
				t.Errorf("/run/berth/leases.env = %q, want TOKEN=%s", f, ph2)
			}
			if got := with(a, ph1); !strings.Contains(got, "auth=placeholder") {
				t.Errorf("resumed sandbox with the old placeholder: secret.test saw %q, want it refused", got)
			}
			if !s.waitLeaseVerdict(a, "lease_revoked") {
				t.Errorf("no lease_revoked entry in the egress log of %s", a)
			}
			if got := with(a, ph2); !strings.Contains(got, "auth=real") {
				t.Errorf("resumed sandbox with the new placeholder: secret.test saw %q", got)
			}
			if out, code := s.run("exec", a, "--", "sh", "-c", "echo x > /run/berth/leases.env"); code == 0 {
				t.Errorf("the sandbox wrote /run/berth/leases.env: %s", out)
			}

			// A fork's child gets its own lease; neither can use the other's.
			res := s.fork(a, 1)
			c := res.Sandboxes[0].ID
			lc := s.liveLease(c)
			phc := envTok(c)
			if lc.Placeholder == ph2 || phc != lc.Placeholder || lc.SandboxID != c {
				t.Fatalf("child lease %+v, env %q, parent's %q", lc, phc, ph2)
			}
			if l := s.liveLease(a); l.ID != l2.ID || l.State != "active" {
				t.Errorf("parent's lease after the fork: %+v, want %s active", l, l2.ID)
			}
			s.installFetch(c, inet)
			if got := with(c, ph2); !strings.Contains(got, "auth=placeholder") {
				t.Errorf("child with the parent's placeholder: secret.test saw %q", got)
			}
			if got := with(a, phc); !strings.Contains(got, "auth=placeholder") {
				t.Errorf("parent with the child's placeholder: secret.test saw %q", got)
			}
			if got := with(c, phc); !strings.Contains(got, "auth=real") {
				t.Errorf("child with its own placeholder: secret.test saw %q", got)
			}

			// Another owner neither sees nor revokes.
			if ls, out, code := s.leases(bob, a); code == 0 || len(ls) != 0 {
				t.Errorf("bob listed %s's leases: exit %d %s", a, code, out)
			}
			if ls, _, code := s.leases(bob); code != 0 || len(ls) != 0 {
				t.Errorf("bob's own lease list: exit %d %+v", code, ls)
			}
			if out, code := s.runAs(bob, nil, "secret", "revoke", lc.ID); code == 0 || !strings.Contains(out, "not found") {
				t.Errorf("bob revoked %s: exit %d %s", lc.ID, code, out)
			}
			if st, _ := s.api(bob, "DELETE", "/v1/leases/"+lc.ID, nil); st != 404 {
				t.Errorf("DELETE /v1/leases/%s as bob: %d, want 404", lc.ID, st)
			}

			// Revoke over REST: the child's own placeholder is refused at
			// once, and nothing is injected without one; the parent's works.
			if st, body := s.api(s.key, "DELETE", "/v1/leases/"+lc.ID, nil); st != 200 || body["state"] != "revoked" {
				t.Fatalf("DELETE /v1/leases/%s: %d %v", lc.ID, st, body)
			}
			if got := with(c, phc); !strings.Contains(got, "auth=placeholder") {
				t.Errorf("child after its lease was revoked: secret.test saw %q", got)
			}
			if got, _ := s.fetchTLS(c, "https://secret.test/"); strings.Contains(got, "auth=real") {
				t.Errorf("child after revoke, no placeholder: secret.test saw %q", got)
			}
			if got := with(a, ph2); !strings.Contains(got, "auth=real") {
				t.Errorf("parent after the child's revoke: secret.test saw %q", got)
			}
			// A revoked grant is not issued again on resume.
			s.must("pause", c, "--mode", "freeze")
			s.must("resume", c)
			if all, _, _ := s.leases(s.key, c); len(all) != 1 || all[0].State != "revoked" {
				t.Errorf("child's leases after revoke + resume: %+v, want only the revoked one", all)
			}

			// A sandbox from an old snapshot: the placeholders in its files
			// (ph1, revoked; ph2, a's) do not work, its own does.
			s.must("exec", a, "--", "sh", "-c", `printf %s "$TOKEN" > /home/user/cur`)
			var sn struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal([]byte(s.must("snapshot", a, "--json")), &sn); err != nil || sn.ID == "" {
				t.Fatalf("snapshot: %v", err)
			}
			snap := sn.ID
			b := s.must("create", "--from-snapshot", snap, "--secret", "TOKEN")
			phb := envTok(b)
			for name, ph := range map[string]string{"old": ph1, "cur": ph2} {
				if f := s.must("exec", b, "--", "cat", "/home/user/"+name); f != ph {
					t.Fatalf("/home/user/%s in the restored sandbox = %q, want %q", name, f, ph)
				}
				if got := with(b, ph); !strings.Contains(got, "auth=placeholder") {
					t.Errorf("restored sandbox with %s placeholder: secret.test saw %q, want it refused", name, got)
				}
			}
			if got := with(b, phb); phb == ph2 || !strings.Contains(got, "auth=real") {
				t.Errorf("restored sandbox with its own placeholder %q: secret.test saw %q", phb, got)
			}
			s.must("rm", "-f", c, b)
			s.must("rm", "-f", a)
		})
	}
}

// TestLeasesSurviveRestart: lease states are in the store; the proxy's
// grants (in memory) are rebuilt from them at start.
func TestLeasesSurviveRestart(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	if out, code := s.runAs(s.key, strings.NewReader(testToken+"\n"), "secret", "set", "TOKEN", "--host", "secret.test"); code != 0 {
		t.Fatalf("secret set: %s", out)
	}
	a := s.create("--secret", "TOKEN", "--disk", "64")
	s.installFetch(a, inet)
	ph1 := s.liveLease(a).Placeholder
	s.must("pause", a, "--mode", "freeze")
	s.must("resume", a)
	before, _, _ := s.leases(s.key, a)
	s.kill9()
	s.start()
	after, _, _ := s.leases(s.key, a)
	sortLeases(before)
	sortLeases(after)
	if len(before) != 2 || len(after) != 2 || before[0] != after[0] || before[1] != after[1] {
		t.Fatalf("leases across a restart:\n%+v\n%+v", before, after)
	}
	ph2 := s.liveLease(a).Placeholder
	with := func(ph string) string {
		out, _ := s.fetchTLS(a, "https://secret.test/", "Authorization: Bearer "+ph)
		return out
	}
	if got := with(ph1); !strings.Contains(got, "auth=placeholder") {
		t.Errorf("after restart the revoked placeholder: secret.test saw %q", got)
	}
	if got := with(ph2); !strings.Contains(got, "auth=real") {
		t.Errorf("after restart the active placeholder: secret.test saw %q", got)
	}

	// --lease-ttl: the lease ends at its expiry, the sandbox does not.
	if out, code := s.run("create", "--template", "tiny", "--secret", "TOKEN", "--lease-ttl", "-5m"); code == 0 || !strings.Contains(out, "lease_ttl") {
		t.Errorf("create --lease-ttl -5m: exit %d: %s", code, out)
	}
	e := s.create("--secret", "TOKEN", "--lease-ttl", "4s")
	s.installFetch(e, inet)
	le := s.liveLease(e)
	var raw []map[string]any
	_ = json.Unmarshal([]byte(s.must("secret", "leases", e, "--json")), &raw)
	if len(raw) != 1 || raw[0]["expires_at"] == nil {
		t.Errorf("lease with --lease-ttl has no expires_at: %v", raw)
	}
	withE := func() string {
		out, _ := s.fetchTLS(e, "https://secret.test/", "Authorization: Bearer "+le.Placeholder)
		return out
	}
	if got := withE(); !strings.Contains(got, "auth=real") {
		t.Errorf("before its expiry: secret.test saw %q", got)
	}
	err := testutil.Within(15 * time.Second).Every(500 * time.Millisecond).Until(func() error {
		if ls, _, _ := s.leases(s.key, e); len(ls) == 1 && ls[0].State == "revoked" && ls[0].Reason == "expired" {
			return nil
		}
		return errNoEntry
	})
	if err != nil {
		t.Fatalf("the lease never expired: %s", s.must("secret", "leases", e))
	}
	if got := withE(); !strings.Contains(got, "auth=placeholder") {
		t.Errorf("after its expiry: secret.test saw %q", got)
	}
	if out := s.must("exec", e, "--", "echo", "alive"); out != "alive" {
		t.Errorf("the sandbox after its lease expired: %q", out)
	}
}

func sortLeases(ls []leaseView) { sort.Slice(ls, func(i, j int) bool { return ls[i].ID < ls[j].ID }) }

// TestLeasesInSandbox: a running process reads its sandbox's current
// placeholder over the in-sandbox API (docs/STATE.md), and sees no other
// sandbox's leases.
func TestLeasesInSandbox(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	if out, code := s.runAs(s.key, strings.NewReader(testToken+"\n"), "secret", "set", "TOKEN", "--host", "secret.test"); code != 0 {
		t.Fatalf("secret set: %s", out)
	}
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" && !strings.Contains(s.must("info"), "runsc") {
				testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
			}
			a := s.create("--runtime", rt, "--secret", "TOKEN")
			other := s.create("--runtime", rt, "--secret", "TOKEN")
			s.must("pause", a, "--mode", "freeze")
			s.must("resume", a)
			cur := s.liveLease(a)
			out, errOut, code := s.runSplit(s.key, nil, "exec", "--user", "root", a, "--", "/.berth/berth-agent", "api", "GET", "/v1/sandboxes/self/leases")
			if code != 0 {
				t.Fatalf("in-sandbox GET self/leases: exit %d: %s%s", code, out, errOut)
			}
			var got struct {
				Leases []leaseView `json:"leases"`
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("in-sandbox leases: %v\n%s", err, out)
			}
			live := ""
			for _, l := range got.Leases {
				if l.SandboxID != a {
					t.Errorf("the sandbox saw another sandbox's lease: %+v", l)
				}
				if l.State == "active" {
					live = l.Placeholder
				}
			}
			if live != cur.Placeholder {
				t.Errorf("in-sandbox current placeholder %q, want %q", live, cur.Placeholder)
			}
			if out, code := s.run("exec", "--user", "root", a, "--", "/.berth/berth-agent", "api", "GET", "/v1/sandboxes/"+other+"/leases"); code == 0 && strings.Contains(out, other) {
				t.Errorf("the sandbox listed %s's leases: %s", other, out)
			}
			if out, code := s.run("exec", "--user", "root", a, "--", "/.berth/berth-agent", "api", "DELETE", "/v1/leases/"+cur.ID); code == 0 {
				t.Errorf("the sandbox revoked its own lease: %s", out)
			}
			s.must("rm", "-f", a, other)
		})
	}
}

// TestLeasesPauseOverhead runs the bench row pause-resume-leases (a freeze
// pause + resume of a sandbox holding a leased secret, against the same of
// a sandbox without, alternating; definition in internal/bench/leases.go)
// on both runtimes and logs the medians. Timings are not asserted; the row
// must be measured with every sample and each resume must have re-issued.
func TestLeasesPauseOverhead(t *testing.T) {
	s := startServer(t)
	rts := []string{"runc"}
	if strings.Contains(s.must("info"), "runsc") {
		rts = append(rts, "runsc")
	}
	const runs = 30
	r, err := bench.NewRunner(bench.NewClient(s.url, s.key), bench.Options{Only: []string{"pause-resume-leases"}, Runs: runs, Warmups: 1,
		Runtimes: rts, Template: "tiny"}, nil, errors.New("no raw baselines here"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range rep.Metrics {
		if !m.Available || m.Summary == nil || m.Summary.N != runs || m.Baseline == nil || m.Baseline.Summary == nil || m.Baseline.Summary.N != runs {
			t.Errorf("%s on %s: %+v", m.Name, m.Runtime, m)
			continue
		}
		if g := m.Derived["generations"]; g != runs+2 { // the first lease and one per cycle
			t.Errorf("%s: %v lease generations after %d cycles, want %d", m.Runtime, g, runs+1, runs+2)
		}
		t.Logf("pause-resume-leases %s: p50 %.1f ms (p95 %.1f) vs %.1f ms (p95 %.1f) without a secret: ratio %.3f",
			m.Runtime, m.Summary.P50, m.Summary.P95, m.Baseline.Summary.P50, m.Baseline.Summary.P95, *m.Ratio)
	}
}

// TestLeasesRewind: the credential row's restore cell for a rewind in
// place (TestLeases covers create from an old snapshot): the rewound
// sandbox gets a new generation, the placeholder it held before the rewind
// is refused by the server and the new one works, on runc and runsc.
func TestLeasesRewind(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	if out, code := s.runAs(s.key, strings.NewReader(testToken+"\n"), "secret", "set", "TOKEN", "--host", "secret.test"); code != 0 {
		t.Fatalf("secret set: %s", out)
	}
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" && !strings.Contains(s.must("info"), "runsc") {
				testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
			}
			a := s.create("--runtime", rt, "--secret", "TOKEN", "--disk", "64")
			s.installFetch(a, inet)
			ck := s.checkpoint(s.key, a, "--name", "start")
			l1 := s.liveLease(a)
			ph1 := s.must("exec", a, "--", "sh", "-c", `printf %s "$TOKEN"`)
			s.rewind(a, ck.ID)
			l2 := s.liveLease(a)
			ph2 := s.must("exec", a, "--", "sh", "-c", `printf %s "$TOKEN"`)
			if l2.Generation != l1.Generation+1 || l2.Placeholder == ph1 || ph2 != l2.Placeholder {
				t.Fatalf("after rewind: lease %+v, env TOKEN=%q (before: %+v, %q)", l2, ph2, l1, ph1)
			}
			if all, _, _ := s.leases(s.key, a); len(all) != 2 || all[0].ID != l1.ID || all[0].State != "revoked" || all[0].Reason != "restored" {
				t.Errorf("after rewind the first lease is %+v, want revoked (restored)", all)
			}
			if out, _ := s.fetchTLS(a, "https://secret.test/", "Authorization: Bearer "+ph1); !strings.Contains(out, "auth=placeholder") {
				t.Errorf("rewound sandbox with the pre-rewind placeholder: secret.test saw %q, want it refused", out)
			}
			if out, _ := s.fetchTLS(a, "https://secret.test/", "Authorization: Bearer "+ph2); !strings.Contains(out, "auth=real") {
				t.Errorf("rewound sandbox with its new placeholder: secret.test saw %q", out)
			}
			s.must("rm", "-f", a)
		})
	}
}
