package agentapi

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

func TestLineLimiter(t *testing.T) {
	ok := `{"type":"start"}` + "\n" + `{"type":"create","name":"` + strings.Repeat("a", 60) + `"}` + "\n"
	dec := json.NewDecoder(newLineLimiter(strings.NewReader(ok), 100))
	for i := 0; i < 2; i++ {
		var ev FSEvent
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	// An endless line fails once past the bound, without reading it all.
	long := io.MultiReader(strings.NewReader(`{"type":"create","name":"`), neverEnding('a'))
	dec = json.NewDecoder(newLineLimiter(long, 100))
	var ev FSEvent
	if err := dec.Decode(&ev); !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("endless line: %v, want ResourceExhausted", err)
	}
}

type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}
