package daemon

import (
	"context"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/notes"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Notes is the handoff-note service (internal/notes).
func (d *Daemon) Notes() *notes.Service { return d.notes }

// notesCore is what internal/notes needs of the core.
type notesCore struct{ d *Daemon }

var _ notes.Core = notesCore{}

func (c notesCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return c.d.Visible(ctx, owner, id)
}

// Agent is the agent client without Daemon.Agent's auto-resume: a note is
// written under the sandbox's lock (a hook) or of a sandbox as it is.
func (c notesCore) Agent(sb *sandbox.Sandbox) *agentapi.Client {
	if sb.State != sandbox.Running {
		return nil
	}
	return c.d.AgentClient(sb.ID)
}

// Tree is the lineage view of sb (runc's host upper, or runsc's exported
// sentry upper) and how many of its top layers lie above the template's
// layers: the upper, plus a fork's or a rewound sandbox's captured layers.
func (c notesCore) Tree(ctx context.Context, sb *sandbox.Sandbox) (*fsdiff.Tree, int, func() error, error) {
	v, err := c.d.lineage.View(ctx, sb)
	if err != nil {
		return nil, 0, nil, err
	}
	own := 1 + len(v.Digests) // nothing known of the template: every layer counts
	if tpl, err := c.d.store.GetTemplate(ctx, sb.Template); err == nil && tpl.Fingerprint == sb.TemplateID {
		n := 0
		for n < len(tpl.Layers) && n < len(v.Digests) && v.Digests[len(v.Digests)-1-n] == tpl.Layers[len(tpl.Layers)-1-n] {
			n++
		}
		own = 1 + len(v.Digests) - n
	} else {
		own = 1 // the template changed: only the upper is surely the sandbox's
	}
	if v.Upper == "" {
		own--
	}
	return v.Tree, own, v.Close, nil
}
