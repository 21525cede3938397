package client

import (
	"context"
	"net/http"
	"strconv"

	"github.com/berth-dev/berth/api/wire"
)

// Notes are a sandbox's handoff notes (docs/NOTES.md). Its own type so
// client.Sandbox stays small.
type Notes struct{ s *Sandbox }

// Notes returns the sandbox's handoff notes.
func (s *Sandbox) Notes() *Notes { return &Notes{s: s} }

// Current is the newest note (Note nil before the first) and the desync.
func (n *Notes) Current(ctx context.Context) (wire.CurrentNote, error) {
	var out wire.CurrentNote
	err := n.s.call(ctx, http.MethodGet, nil, nil, &out, "note")
	return out, err
}

// Write writes a note now with what req supplies.
func (n *Notes) Write(ctx context.Context, req wire.NoteRequest) (wire.Note, error) {
	var out wire.Note
	err := n.s.call(ctx, http.MethodPost, nil, req, &out, "note")
	return out, err
}

// List is every kept note, newest first.
func (n *Notes) List(ctx context.Context) ([]wire.Note, error) {
	var out wire.NoteList
	err := n.s.call(ctx, http.MethodGet, nil, nil, &out, "notes")
	return out.Notes, err
}

// Get is note seq.
func (n *Notes) Get(ctx context.Context, seq int64) (wire.Note, error) {
	var out wire.Note
	err := n.s.call(ctx, http.MethodGet, nil, nil, &out, "notes", strconv.FormatInt(seq, 10))
	return out, err
}

// ResumeWithNote resumes the sandbox and returns the answer with its
// handoff note and desync (Resume returns the plain Sandbox).
func (n *Notes) ResumeWithNote(ctx context.Context) (wire.ResumeResult, error) {
	var out wire.ResumeResult
	err := n.s.call(ctx, http.MethodPost, nil, nil, &out, "resume")
	return out, err
}
