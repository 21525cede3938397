package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/testutil"
)

// effects lists a sandbox's side-effect ledger through the CLI.
func (s *server) effects(id string, args ...string) []wire.Effect {
	s.t.Helper()
	var l wire.EffectList
	if err := json.Unmarshal([]byte(s.must(append([]string{"effects", id, "--json"}, args...)...)), &l); err != nil {
		s.t.Fatal(err)
	}
	return l.Effects
}

// post sends a POST with body from inside sandbox id as root (the fetch client).
func (s *server) post(id, url, body string, headers ...string) (string, bool) {
	s.t.Helper()
	args := []string{"-X", "POST", "-d", body}
	for _, h := range headers {
		args = append(args, "-H", h)
	}
	return s.fetchAs(id, append(args, url)...)
}

// TestEffectsLedger is issue 17's side-effect ledger end to end, on runc
// and runsc, against the test internet's counting endpoint: a POST to an
// effectful host is recorded (intent, then outcome); a fork's retry with
// the same key is answered from the ledger and never reaches the host; a
// rewind lists the effects after the point and a keyless retry of one is
// answered from the ledger; `repeat: refuse` refuses; and a hostile sandbox
// (as root) cannot send a huge body, nor read another lineage's answer
// with a spoofed key.
func TestEffectsLedger(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "runsc" && !strings.Contains(s.must("info"), "runsc") {
				testutil.Missing(t, "runsc is not configured on this server (scripts/setup.sh installs it)")
			}
			p := s.create("--runtime", rt, "--allow", "good.test", "--effectful", "good.test", "--disk", "64")
			s.installFetch(p, inet)
			ck := s.checkpoint(s.key, p, "--name", "before")
			var snap wire.Snapshot
			if err := json.Unmarshal([]byte(s.must("snapshot", p, "--json")), &snap); err != nil {
				t.Fatal(err)
			}
			key := "Idempotency-Key: order-" + rt

			// 1. A POST is recorded: intent and outcome.
			out, ok := s.post(p, "https://good.test/count/"+rt+"-a", "hello", key)
			if !ok || !strings.Contains(out, "count=1 key=order-"+rt+" body=5") || !strings.Contains(out, "effect=ef") {
				t.Fatalf("first POST: %q", out)
			}
			list := s.effects(p)
			if len(list) != 1 {
				t.Fatalf("ledger of %s: %+v, want one effect", p, list)
			}
			e := list[0]
			if e.Method != "POST" || e.Host != "good.test" || e.Path != "/count/"+rt+"-a" || e.State != "completed" || e.Status != 200 ||
				e.IdempotencyKey != "order-"+rt || e.KeySource != "agent" || e.BodySize != 5 || len(e.BodySHA256) != 64 || !e.Replayable || e.Inherited {
				t.Fatalf("effect = %+v", e)
			}
			// A GET to the same host is not a side effect.
			if out, ok := s.fetchAs(p, "https://good.test/count/"+rt+"-a"); !ok || !strings.Contains(out, "count=1") || len(s.effects(p)) != 1 {
				t.Fatalf("GET: %q, ledger %d entries", out, len(s.effects(p)))
			}
			// A keyless one.
			out, ok = s.post(p, "https://good.test/count/"+rt+"-b", "keyless")
			if !ok || !strings.Contains(out, "count=1 key= ") {
				t.Fatalf("keyless POST: %q", out)
			}

			// 1b. Pause keeps the ledger; after resume the sandbox queries it
			// before a retry, and the retry with the key is answered from it.
			s.must("pause", p, "--mode", "freeze")
			if pl := s.effects(p); len(pl) != 2 {
				t.Fatalf("ledger of the paused sandbox: %d effects, want 2", len(pl))
			}
			s.must("resume", p)
			if rl := s.effects(p); len(rl) != 2 || rl[0].ID != e.ID {
				t.Fatalf("ledger after resume: %+v, want the same two effects", rl)
			}
			out, ok = s.post(p, "https://good.test/count/"+rt+"-a", "hello", key)
			if !ok || !strings.Contains(out, "effect="+e.ID+"; replayed") || inet.Count(rt+"-a") != 1 {
				t.Fatalf("retry after resume: %q (host counted %d), want the recorded answer and 1", out, inet.Count(rt+"-a"))
			}

			// 2. A fork sees both, inherited; its retry with the key is
			// answered from the ledger and never reaches the host.
			var fr wire.ForkResult
			if err := json.Unmarshal([]byte(s.must("fork", p, "--json")), &fr); err != nil || len(fr.Sandboxes) != 1 {
				t.Fatalf("fork: %v %+v", err, fr)
			}
			c := fr.Sandboxes[0].ID
			if cl := s.effects(c); len(cl) != 2 || !cl[0].Inherited || cl[0].ID != e.ID || cl[0].Sandbox != p || !cl[1].Inherited {
				t.Fatalf("child's ledger: %+v, want the parent's two effects, inherited", cl)
			}
			out, ok = s.post(c, "https://good.test/count/"+rt+"-a", "hello", key)
			if !ok || !strings.Contains(out, "count=1") || !strings.Contains(out, "effect="+e.ID+"; replayed") {
				t.Fatalf("child's retry: %q, want the recorded answer", out)
			}
			if n := inet.Count(rt + "-a"); n != 1 {
				t.Fatalf("the test host counted %d POSTs, want 1 (the fork's retry must not be sent)", n)
			}

			// 3. Restored to before the POSTs, from a snapshot: a keyless retry
			// is answered from the ledger.
			r := s.must("create", "--from-snapshot", snap.ID, "--runtime", rt, "--allow", "good.test", "--effectful", "good.test")
			out, ok = s.post(r, "https://good.test/count/"+rt+"-b", "keyless")
			if !ok || !strings.Contains(out, "count=1") || !strings.Contains(out, "replayed") {
				t.Fatalf("keyless retry from a snapshot taken before it: %q, want the recorded answer", out)
			}
			if n := inet.Count(rt + "-b"); n != 1 {
				t.Fatalf("the test host counted %d keyless POSTs, want 1", n)
			}

			// 4. Rewound in place to before them: effects_after lists both.
			rw := s.rewind(p, ck.ID)
			var after []string
			for _, ef := range rw.EffectsAfter {
				after = append(after, ef.Path)
			}
			if strings.Join(after, ",") != "/count/"+rt+"-a,/count/"+rt+"-b" {
				t.Fatalf("rewind effects_after = %v, want both POSTs made after the checkpoint", after)
			}
			if since := s.effects(p, "--since", "before"); len(since) != 2 {
				t.Fatalf("effects --since before: %d, want 2", len(since))
			}
			// The sandbox rewound in place (on runsc too: TestRewindKeepsNetwork)
			// retries the keyless POST: answered from the ledger, not sent.
			out, ok = s.post(p, "https://good.test/count/"+rt+"-b", "keyless")
			if !ok || !strings.Contains(out, "count=1") || !strings.Contains(out, "replayed") {
				t.Fatalf("keyless retry after the rewind: %q, want the recorded answer", out)
			}
			if n := inet.Count(rt + "-b"); n != 1 {
				t.Fatalf("the test host counted %d keyless POSTs after the rewind, want 1", n)
			}
			// And its retry with the key, too.
			out, ok = s.post(p, "https://good.test/count/"+rt+"-a", "hello", key)
			if !ok || !strings.Contains(out, "count=1") || !strings.Contains(out, "effect="+e.ID+"; replayed") {
				t.Fatalf("keyed retry after the rewind: %q, want the recorded answer", out)
			}
			if n := inet.Count(rt + "-a"); n != 1 {
				t.Fatalf("the test host counted %d keyed POSTs after the rewind, want 1", n)
			}

			// 5. repeat: refuse.
			s.must("net", "set", c, "--allow", "good.test", "--effectful", "good.test", "--repeat", "refuse")
			out, ok = s.post(c, "https://good.test/count/"+rt+"-a", "hello", key)
			if ok || !strings.Contains(out, "HTTP 409") || !strings.Contains(out, "repeat: refuse") {
				t.Fatalf("retry under repeat: refuse: %q, want 409", out)
			}
			if n := inet.Count(rt + "-a"); n != 1 {
				t.Fatalf("the test host counted %d POSTs after a refusal, want 1", n)
			}

			// 6. Hostile sandbox: a body over the bound is refused, never sent.
			out, ok = s.post(c, "https://good.test/count/"+rt+"-huge", "@9000000")
			if ok || !strings.Contains(out, "HTTP 413") || inet.Count(rt+"-huge") != 0 {
				t.Fatalf("huge body: %q, count %d; want 413 and nothing sent", out, inet.Count(rt+"-huge"))
			}
			// Another lineage spoofing the key: sent as its own, it never gets
			// the first lineage's recorded answer, and lists only its own.
			o := s.create("--runtime", rt, "--allow", "good.test", "--effectful", "good.test", "--disk", "64")
			s.installFetch(o, inet)
			out, ok = s.post(o, "https://good.test/count/"+rt+"-a", "hello", key)
			if !ok || strings.Contains(out, "replayed") || !strings.Contains(out, "count=2") {
				t.Fatalf("spoofed key from another lineage: %q, want its own request sent (count=2)", out)
			}
			if ol := s.effects(o); len(ol) != 1 || ol[0].Sandbox != o || ol[0].Inherited {
				t.Fatalf("other lineage's ledger: %+v", ol)
			}
			for _, id := range []string{p, c, r, o} {
				s.must("rm", "-f", id)
			}
		})
	}
}

// TestEffectsInSandbox reads the ledger from inside the sandbox through
// the in-sandbox API (docs/STATE.md): its own effects only, another
// sandbox's ledger is refused. It needs the in-sandbox API transport
// (berth-agent api) and "GET /v1/sandboxes/{id}/effects" in selfRoutes.
func TestEffectsInSandbox(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	p := s.create("--allow", "good.test", "--effectful", "good.test", "--disk", "64")
	other := s.create("--disk", "64")
	if out, _ := s.run("exec", p, "--", "/.berth/berth-agent", "api", "GET", "/v1/sandboxes/self"); !strings.Contains(out, p) {
		testutil.Missing(t, "the in-sandbox API (berth-agent api) is not in this build: %q", out)
	}
	s.installFetch(p, inet)
	if out, ok := s.post(p, "https://good.test/count/inside", "x", "Idempotency-Key: in-1"); !ok {
		t.Fatalf("POST: %q", out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := s.run("exec", "--user", "root", p, "--", "/.berth/berth-agent", "api", "GET", "/v1/sandboxes/self/effects")
		var l wire.EffectList
		if json.Unmarshal([]byte(out), &l) == nil && l.Sandbox == p && len(l.Effects) == 1 &&
			l.Effects[0].Path == "/count/inside" && l.Effects[0].IdempotencyKey == "in-1" && l.Effects[0].State == "completed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("in-sandbox GET self/effects: %q", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, _ := s.run("exec", "--user", "root", p, "--", "/.berth/berth-agent", "api", "GET", "/v1/sandboxes/"+other+"/effects")
	var l wire.EffectList
	if json.Unmarshal([]byte(out), &l) == nil && l.Sandbox != "" {
		t.Fatalf("a sandbox read another sandbox's ledger: %q", out)
	}
	if !strings.Contains(out, "404") && !strings.Contains(out, "403") && !strings.Contains(out, "not found") {
		t.Fatalf("another sandbox's ledger from inside: %q, want a refusal", out)
	}
}
