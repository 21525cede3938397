package audit

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/statehook"
)

// OnState records a lifecycle moment (statehook.Hook): action
// "sandbox.<phase>", with the fork's parent or the restored point.
func (s *Service) OnState(_ context.Context, ev statehook.Event) error {
	if ev.Sandbox == nil {
		return nil
	}
	d := map[string]string{}
	set := func(k, v string) {
		if v != "" {
			d[k] = v
		}
	}
	set("from", ev.From)
	set("checkpoint", ev.Checkpoint)
	set("snapshot", ev.Snapshot)
	if !ev.PointAt.IsZero() {
		d["point_at"] = ev.PointAt.UTC().Format(time.RFC3339Nano)
	}
	sb := ev.Sandbox
	switch ev.Phase {
	case statehook.Paused:
		set("mode", string(sb.PauseActual))
		set("requested", string(sb.PauseRequested))
	case statehook.Forked:
		set("parent", sb.Attrs.Lineage.Parent)
		if g := sb.Attrs.Lineage.Generation; g > 0 {
			d["generation"] = strconv.Itoa(g)
		}
	}
	set("state", string(sb.State))
	actor := ev.Actor
	if actor == "" {
		actor = "berth"
	}
	s.Record(Entry{Time: ev.At, Actor: actor, Action: "sandbox." + string(ev.Phase), SandboxID: sb.ID, Owner: sb.Owner, Data: d})
	return nil
}

// Observe wraps a sandbox's agent observer (the activity timeline's) so
// every exec through the API — REST exec, E2B process start — is also an
// `exec` entry with its command line, user, cwd and whether it has a TTY.
// The principal who asked is the API entry recorded with the request.
func (s *Service) Observe(id string, next agentapi.Observer) agentapi.Observer {
	return observer{s: s, id: id, next: next}
}

type observer struct {
	s    *Service
	id   string
	next agentapi.Observer
}

func (o observer) Exec(req agentapi.ExecRequest) agentapi.ExecObserver {
	argv := req.Argv
	if req.Shell != "" {
		argv = []string{"/bin/sh", "-c", req.Shell}
	}
	// A bounded copy (the request's own slice is the agent's).
	out := make([]string, 0, min(len(argv), MaxKeys)+1)
	for i, a := range argv {
		if i == MaxKeys {
			out = append(out, "…")
			break
		}
		out = append(out, clip(a, MaxValue/4))
	}
	b, _ := json.Marshal(out)
	d := map[string]string{"argv": string(b), "user": req.User, "cwd": req.Cwd}
	if req.TTY != nil {
		d["tty"] = "true"
	}
	o.s.Record(Entry{Actor: "api", Action: "exec", SandboxID: o.id, Data: d})
	if o.next == nil {
		return nil
	}
	return o.next.Exec(req)
}

func (o observer) Input(pid, n int) {
	if o.next != nil {
		o.next.Input(pid, n)
	}
}

func (o observer) FileChanged(op, path, to string, size int64) {
	if o.next != nil {
		o.next.FileChanged(op, path, to, size)
	}
}
