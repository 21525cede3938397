package e2e

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/berth-dev/berth/api/wire"
)

// as runs a CLI verb with key and fails the test on a non-zero exit.
func (s *server) as(key string, args ...string) string {
	s.t.Helper()
	out, stderr, code := s.runSplit(key, nil, args...)
	if code != 0 {
		s.t.Fatalf("berth %s: exit %d: %s%s", strings.Join(args, " "), code, out, stderr)
	}
	return out
}

func (s *server) taskLedger(key, id string) wire.TaskLedger {
	s.t.Helper()
	var l wire.TaskLedger
	if err := json.Unmarshal([]byte(s.as(key, "task", "ls", id, "--json")), &l); err != nil {
		s.t.Fatal(err)
	}
	return l
}

func stepStatuses(l wire.TaskLedger) []string {
	var out []string
	for _, t := range l.Tasks {
		for _, st := range t.Steps {
			out = append(out, st.Status)
		}
	}
	return out
}

// TestTaskLedgerStateTable: the task ledger's row of the state table
// (docs/STATE.md) with real sandboxes on runc and runsc — pause/resume keep
// it and show it with the sandbox; a fork's child gets a copy marked as
// forked at step N of its parent and its edits leave the parent alone; a
// sandbox created from a snapshot taken at step 2, and a rewind to a
// checkpoint taken at step 2 after steps 3-4, hold the ledger at step 2 with
// a warning naming steps 3-4; a gate is approved by the owner over REST,
// and another owner gets 404.
func TestTaskLedgerStateTable(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	alice := strings.TrimSpace(s.must("key", "create", "--owner", "alice"))
	bob := strings.TrimSpace(s.must("key", "create", "--owner", "bob"))
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := strings.TrimSpace(s.as(alice, "create", "--template", "tiny", "--runtime", rt))
			defer s.run("rm", "-f", id)
			s.as(alice, "task", "create", id, "--name", "deploy", "--step", "s1", "--step", "s2", "--step", "s3", "--step", "s4")
			step := func(sb, n, op string, extra ...string) {
				t.Helper()
				s.as(alice, append([]string{"task", "step", sb, "deploy", n, op}, extra...)...)
			}
			step(id, "1", "start")
			step(id, "1", "done")
			step(id, "s2", "start")
			step(id, "s2", "done", "--output", "build/app.tar")
			cp := s.checkpoint(alice, id, "--name", "at-step-2")
			var snap wire.Snapshot
			if err := json.Unmarshal([]byte(s.as(alice, "snapshot", id, "--json")), &snap); err != nil {
				t.Fatal(err)
			}
			step(id, "3", "start")
			step(id, "3", "done")
			step(id, "4", "start")

			// Pause keeps it; the sandbox's answer shows it, paused and resumed.
			s.as(alice, "pause", id)
			for _, what := range []string{"paused", "resumed"} {
				if what == "resumed" {
					var sb wire.Sandbox
					if err := json.Unmarshal([]byte(s.as(alice, "resume", id, "--json")), &sb); err != nil {
						t.Fatal(err)
					}
					if sum := sb.Tasks; sum == nil || sum.Task != "deploy" || sum.Step != 4 || sum.Status != "running" {
						t.Errorf("resume answer's ledger = %+v, want deploy at step 4 running", sum)
					}
				}
				sum := s.sandbox(id).Tasks
				if sum == nil || sum.Tasks != 1 || sum.Task != "deploy" || sum.Step != 4 || sum.StepName != "s4" || sum.Status != "running" {
					t.Errorf("%s: inspect's ledger = %+v, want deploy at step 4 (s4) running", what, sum)
				}
			}
			if got := stepStatuses(s.taskLedger(alice, id)); !reflect.DeepEqual(got, []string{"done", "done", "done", "running"}) {
				t.Errorf("ledger after pause/resume = %v", got)
			}

			// Fork: the child's copy is marked, and diverges alone.
			child := s.fork(id, 1).Sandboxes[0].ID
			defer s.run("rm", "-f", child)
			cl := s.taskLedger(alice, child)
			if len(cl.Tasks) != 1 || cl.Tasks[0].Forked == nil || cl.Tasks[0].Forked.Parent != id || cl.Tasks[0].Forked.AtStep != 4 {
				t.Fatalf("child's ledger = %+v, want deploy forked from %s at step 4", cl.Tasks, id)
			}
			if sum := s.sandbox(child).Tasks; sum == nil || sum.Forked == nil || sum.Forked.AtStep != 4 {
				t.Errorf("child's inspect shows no fork mark: %+v", sum)
			}
			step(child, "4", "fail")
			step(child, "4", "start")
			var ct wire.Task
			if err := json.Unmarshal([]byte(s.as(alice, "task", "show", child, "deploy", "--json")), &ct); err != nil {
				t.Fatal(err)
			}
			if ct.Steps[3].Attempts != 2 {
				t.Errorf("child's step 4 attempts = %d, want 2 (start, fail, start)", ct.Steps[3].Attempts)
			}
			if pl := s.taskLedger(alice, id); pl.Tasks[0].Forked != nil || pl.Tasks[0].Steps[3].Attempts != 1 {
				t.Errorf("the child's edits reached the parent: %+v", pl.Tasks[0])
			}
			step(id, "4", "done")

			// Create from the snapshot taken at step 2.
			fromSnap := strings.TrimSpace(s.as(alice, "create", "--from-snapshot", snap.ID))
			defer s.run("rm", "-f", fromSnap)
			fl := s.taskLedger(alice, fromSnap)
			if got := stepStatuses(fl); !reflect.DeepEqual(got, []string{"done", "done", "pending", "pending"}) {
				t.Errorf("ledger of the sandbox from the snapshot = %v, want step 2's", got)
			}
			if fl.Rollback == nil || !reflect.DeepEqual(fl.Rollback.Steps, []string{"deploy/3 (s3)", "deploy/4 (s4)"}) || fl.Rollback.Snapshot != snap.ID {
				t.Errorf("rollback warning from the snapshot = %+v, want steps 3-4 of %s", fl.Rollback, snap.ID)
			}

			// Rewind to the checkpoint taken at step 2.
			res := s.rewind(id, cp.ID)
			if res.TaskRollback == nil || !reflect.DeepEqual(res.TaskRollback.Steps, []string{"deploy/3 (s3)", "deploy/4 (s4)"}) || res.TaskRollback.Checkpoint != cp.ID {
				t.Errorf("rewind's task_rollback = %+v, want steps 3-4", res.TaskRollback)
			}
			l := s.taskLedger(alice, id)
			if got := stepStatuses(l); !reflect.DeepEqual(got, []string{"done", "done", "pending", "pending"}) {
				t.Errorf("ledger after rewind = %v, want step 2's", got)
			}
			if l.Tasks[0].Steps[1].Output != "build/app.tar" {
				t.Errorf("step 2's output after rewind = %q", l.Tasks[0].Steps[1].Output)
			}
			if out := s.as(alice, "task", "ls", id); !strings.Contains(out, "deploy/3 (s3), deploy/4 (s4)") {
				t.Errorf("berth task ls shows no rollback warning:\n%s", out)
			}
			if sum := s.sandbox(id).Tasks; sum == nil || sum.Step != 3 || sum.Rollback == nil {
				t.Errorf("inspect after rewind = %+v, want step 3 and the warning", sum)
			}

			// A gate: asked, refused to another owner (404), approved by the owner.
			var gt wire.Task
			if err := json.Unmarshal([]byte(s.as(alice, "task", "ask", id, "deploy", "--question", "ship s4?", "--step", "s4", "--json")), &gt); err != nil {
				t.Fatal(err)
			}
			gate := gt.Gates[len(gt.Gates)-1].ID
			path := "/v1/sandboxes/" + id + "/tasks/deploy/gates/" + gate + "/approve"
			if code, body := s.api(bob, "POST", path, nil); code != http.StatusNotFound {
				t.Errorf("bob approving alice's gate: %d %v, want 404", code, body)
			}
			if code, _ := s.api(bob, "GET", "/v1/sandboxes/"+id+"/tasks", nil); code != http.StatusNotFound {
				t.Errorf("bob reading alice's ledger: %d, want 404", code)
			}
			step(id, "3", "done")
			if out, code := s.runAs(alice, nil, "task", "step", id, "deploy", "4", "start"); code == 0 || !strings.Contains(out, gate) {
				t.Errorf("starting the gated step: exit %d: %s; want a refusal naming %s", code, out, gate)
			}
			if code, body := s.api(alice, "POST", path, map[string]any{"comment": "go"}); code != http.StatusOK {
				t.Fatalf("alice approves: %d %v", code, body)
			}
			step(id, "4", "start")
			if sum := s.sandbox(id).Tasks; sum == nil || len(sum.Waiting) != 0 || sum.Step != 4 {
				t.Errorf("after approval: %+v", sum)
			}
		})
	}

	// The ledger is in the store: a crash of the daemon loses none of it.
	id := strings.TrimSpace(s.as(alice, "create", "--template", "tiny"))
	defer s.run("rm", "-f", id)
	s.as(alice, "task", "create", id, "--name", "survive", "--step", "one", "--step", "two")
	s.as(alice, "task", "step", id, "survive", "one", "done", "--output", "https://example.test/1")
	s.as(alice, "task", "step", id, "survive", "two", "start")
	s.as(alice, "task", "ask", id, "survive", "--question", "keep going?")
	before := s.taskLedger(alice, id)
	s.kill9()
	s.start()
	if d := cmpJSON(t, before, s.taskLedger(alice, id)); d != "" {
		t.Errorf("ledger after a daemon crash differs:\n%s", d)
	}
}

func cmpJSON(t *testing.T, a, b any) string {
	t.Helper()
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	if string(x) != string(y) {
		return "before: " + string(x) + "\nafter:  " + string(y)
	}
	return ""
}

// TestTaskLedgerFromInside: the agent reads its ledger, starts and finishes
// steps and asks a gate through the in-sandbox API (`berth-agent api`, as
// root), but cannot approve its own gate nor reach another sandbox's
// ledger; the owner approves it over REST. It needs the in-sandbox API
// (the `self` branch: the transport and selfRoutes with the task routes).
func TestTaskLedgerFromInside(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	alice := strings.TrimSpace(s.must("key", "create", "--owner", "alice"))
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			id := strings.TrimSpace(s.as(alice, "create", "--template", "tiny", "--runtime", rt))
			defer s.run("rm", "-f", id)
			other := strings.TrimSpace(s.as(alice, "create", "--template", "tiny", "--runtime", rt))
			defer s.run("rm", "-f", other)
			s.as(alice, "task", "create", id, "--name", "job", "--step", "a", "--step", "b")
			s.as(alice, "task", "create", other, "--name", "secret")
			api := func(args ...string) (string, int) {
				return s.runAs(alice, nil, append([]string{"exec", "--user", "root", id, "--", "/.berth/berth-agent", "api"}, args...)...)
			}
			if out, code := api("GET", "/v1/sandboxes/self/tasks"); code != 0 || !strings.Contains(out, `"job"`) {
				t.Fatalf("reading its ledger from inside: exit %d: %s", code, out)
			}
			if out, code := api("POST", "/v1/sandboxes/self/tasks/job/steps/a/start"); code != 0 {
				t.Fatalf("starting a step from inside: exit %d: %s", code, out)
			}
			if out, code := api("POST", "/v1/sandboxes/self/tasks/job/steps/a/done", `{"output":"ok"}`); code != 0 {
				t.Fatalf("finishing a step from inside: exit %d: %s", code, out)
			}
			if out, code := api("POST", "/v1/sandboxes/self/tasks/job/gates", `{"question":"run b?","step":"b"}`); code != 0 {
				t.Fatalf("asking a gate from inside: exit %d: %s", code, out)
			}
			if out, code := api("POST", "/v1/sandboxes/self/tasks/job/gates/g1/approve"); code == 0 || !strings.Contains(strings.ToLower(out), "sandbox") {
				t.Errorf("approving its own gate from inside: exit %d: %s; want a refusal", code, out)
			}
			if out, code := api("POST", "/v1/sandboxes/self/tasks/job/gates", `{"question":"x","approvers":["mallory"]}`); code == 0 {
				t.Errorf("naming its own approvers from inside: exit %d: %s; want a refusal", code, out)
			}
			if out, code := api("GET", "/v1/sandboxes/"+other+"/tasks"); code == 0 || strings.Contains(out, "secret") {
				t.Errorf("reading another sandbox's ledger from inside: exit %d: %s", code, out)
			}
			var tk wire.Task
			if err := json.Unmarshal([]byte(s.as(alice, "task", "show", id, "job", "--json")), &tk); err != nil {
				t.Fatal(err)
			}
			if tk.Steps[0].Status != "done" || tk.Steps[0].Output != "ok" || len(tk.Gates) != 1 || tk.Gates[0].Decision != "" || tk.Gates[0].AskedBy != "sandbox:"+id {
				t.Errorf("ledger after the agent's changes = %+v", tk)
			}
			s.as(alice, "task", "approve", id, "job", "g1", "--comment", "fine")
			if out, code := api("POST", "/v1/sandboxes/self/tasks/job/steps/b/start"); code != 0 {
				t.Errorf("starting the approved step from inside: exit %d: %s", code, out)
			}
		})
	}
}
