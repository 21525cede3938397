package e2e

import (
	"strings"
	"testing"
)

// TestConsoleFleet: sign in with the admin key in a real browser; the fleet
// lists sandboxes created through the API, and follows a pause.
func TestConsoleFleet(t *testing.T) {
	s := startServer(t)
	a := s.create()
	bID := s.create()
	b := startBrowser(t, s)
	b.signIn(s.key)
	b.waitText("#sandboxes", a)
	b.waitText("#sandboxes", bID)
	b.screenshots("fleet")

	s.must("pause", a)
	b.waitText(`#sandboxes tr[data-id="`+a+`"]`, "paused")
	if got := b.text(`#state-counts tr[data-state="paused"] .count`); strings.TrimSpace(got) != "1" {
		t.Errorf("paused count = %q, want 1", got)
	}
}
