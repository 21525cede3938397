package client

import (
	"context"
	"net/http"

	"github.com/berth-dev/berth/api/wire"
)

// Timeline is a sandbox's timeline: checkpoints, rewind, promote. It is
// its own type so client.Sandbox stays small.
type Timeline struct{ s *Sandbox }

// Timeline returns the sandbox's timeline.
func (s *Sandbox) Timeline() *Timeline { return &Timeline{s: s} }

// Checkpoint puts a checkpoint on the timeline (POST .../checkpoints).
func (t *Timeline) Checkpoint(ctx context.Context, req wire.CheckpointRequest) (wire.Checkpoint, error) {
	var out wire.Checkpoint
	err := t.s.call(ctx, http.MethodPost, nil, req, &out, "checkpoints")
	return out, err
}

// List is the sandbox's timeline, checkpoints by seq.
func (t *Timeline) List(ctx context.Context) (wire.Timeline, error) {
	var out wire.Timeline
	err := t.s.call(ctx, http.MethodGet, nil, nil, &out, "checkpoints")
	return out, err
}

// Get returns checkpoint ref (id, name or seq).
func (t *Timeline) Get(ctx context.Context, ref string) (wire.Checkpoint, error) {
	var out wire.Checkpoint
	err := t.s.call(ctx, http.MethodGet, nil, nil, &out, "checkpoints", seg(ref))
	return out, err
}

// Delete removes checkpoint ref from the timeline.
func (t *Timeline) Delete(ctx context.Context, ref string) error {
	return t.s.call(ctx, http.MethodDelete, nil, nil, nil, "checkpoints", seg(ref))
}

// Rewind takes the sandbox back to checkpoint to (id, name or seq), in place.
func (t *Timeline) Rewind(ctx context.Context, to string) (wire.RewindResult, error) {
	var out wire.RewindResult
	err := t.s.call(ctx, http.MethodPost, nil, wire.RewindRequest{To: to}, &out, "rewind")
	return out, err
}

// Promote makes this sandbox (a fork child) its parent's state;
// discardOthers deletes the parent's other children afterwards.
func (t *Timeline) Promote(ctx context.Context, discardOthers bool) (wire.PromoteChildResult, error) {
	var out wire.PromoteChildResult
	err := t.s.call(ctx, http.MethodPost, nil, wire.PromoteChildRequest{DiscardOthers: discardOthers}, &out, "promote")
	return out, err
}
