package e2b

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/api/gen/filesystem"
	"github.com/berth-dev/berth/internal/agentapi"
)

func TestWatchEvent(t *testing.T) {
	entry := &agentapi.EntryInfo{Name: "f", Type: "file", Path: "/home/user/d/f", Size: 3}
	for _, c := range []struct {
		name         string
		ev           agentapi.FSEvent
		includeEntry bool
		wantNil      bool
		wantType     filesystem.EventType
		wantEntry    bool
	}{
		{"write with entry", agentapi.FSEvent{Type: "write", Name: "f", Entry: entry}, true, false, filesystem.EventType_EVENT_TYPE_WRITE, true},
		{"entry not asked for", agentapi.FSEvent{Type: "write", Name: "f", Entry: entry}, false, false, filesystem.EventType_EVENT_TYPE_WRITE, false},
		{"remove never has one", agentapi.FSEvent{Type: "remove", Name: "f", Entry: entry}, true, false, filesystem.EventType_EVENT_TYPE_REMOVE, false},
		{"rename never has one", agentapi.FSEvent{Type: "rename", Name: "f", Entry: entry}, true, false, filesystem.EventType_EVENT_TYPE_RENAME, false},
		{"oversized name dropped", agentapi.FSEvent{Type: "create", Name: strings.Repeat("a", maxWatchName+1)}, true, true, 0, false},
		{"oversized entry dropped", agentapi.FSEvent{Type: "create", Name: "f", Entry: &agentapi.EntryInfo{Path: strings.Repeat("a", maxWatchName+1)}}, true, true, 0, false},
		{"unknown type skipped", agentapi.FSEvent{Type: "future", Name: "f"}, true, true, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := watchEvent(c.ev, c.includeEntry)
			if c.wantNil {
				if out != nil {
					t.Fatalf("got %v, want nothing forwarded", out)
				}
				return
			}
			fe := out.GetFilesystem()
			if fe == nil || fe.GetType() != c.wantType || fe.GetName() != c.ev.Name {
				t.Fatalf("got %v", out)
			}
			if got := fe.GetEntry() != nil; got != c.wantEntry {
				t.Fatalf("entry forwarded = %v, want %v", got, c.wantEntry)
			}
			if c.wantEntry && (fe.GetEntry().GetPath() != entry.Path || fe.GetEntry().GetSize() != 3) {
				t.Fatalf("entry = %v", fe.GetEntry())
			}
		})
	}
}
