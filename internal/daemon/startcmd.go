package daemon

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// runStartCommand starts the template's start command (Dockerfile CMD, an
// image's Entrypoint+Cmd) in the background on every boot — create, start,
// and resume from a disk pause. It runs as the template's user in its
// workdir, tagged "start" so it can be found with the process list. A
// start command that cannot start is an event, not a failed sandbox: the
// sandbox itself is fine and the owner can look at why.
func runStartCommand(ctx context.Context, d startCore, sb *sandbox.Sandbox, tpl *store.Template) {
	if tpl == nil || len(tpl.StartCmd) == 0 {
		return
	}
	st, err := d.AgentClient(sb.ID).Exec(ctx, agentapi.ExecRequest{
		Argv: tpl.StartCmd, Cwd: tpl.Workdir, User: tpl.User, Tag: "start",
	}, 0)
	if err == nil {
		var ev agentapi.Event
		ev, err = st.Next()
		st.Close() // the process keeps running; only this stream ends
		if err == nil && ev.Type == "start" {
			d.Event(ctx, sb, "berth", "start_command", "started", strings.Join(tpl.StartCmd, " "),
				map[string]string{"pid": strconv.Itoa(ev.Pid)})
			return
		}
		if err == nil {
			err = errStartEvent(ev)
		}
	}
	d.Log().Warn("template start command did not start", "sandbox_id", sb.ID, "template", tpl.Name, "err", err)
	d.Event(ctx, sb, "berth", "start_command", "failed", errs.Short(err), nil)
}

// startCore is what starting a start command needs of the core.
type startCore interface {
	AgentClient(id string) *agentapi.Client
	Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string)
	Log() *slog.Logger
}

type startEventError struct{ ev agentapi.Event }

func (e startEventError) Error() string {
	if e.ev.Error != "" {
		return e.ev.Error
	}
	return "unexpected first event " + e.ev.Type
}

func errStartEvent(ev agentapi.Event) error { return startEventError{ev} }
