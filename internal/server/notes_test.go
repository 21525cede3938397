package server

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/notes"
)

// TestNoteViewMatchesDomainJSON: the REST note (noteView) and the domain
// note's own JSON, which the E2B connect answer carries, are the same
// document, every field filled.
func TestNoteViewMatchesDomainJSON(t *testing.T) {
	n := filled[notes.Note]()
	if d := cmp.Diff(asJSON(t, n), asJSON(t, noteView(n))); d != "" {
		t.Errorf("notes.Note JSON vs wire.Note (-domain +wire):\n%s", d)
	}
	cur := notes.Current{Note: &n, Desync: n.Desync}
	if got := currentNoteView(cur); got.Note == nil || got.Desync == nil || got.Desync.AgentVersion != n.Desync.AgentVersion {
		t.Errorf("currentNoteView = %+v", got)
	}
}
