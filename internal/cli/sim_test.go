package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// berth sim runs without a server: the table by default, JSON on request,
// a usage error for a bad flag value.
func TestSim(t *testing.T) {
	args := []string{"sim", "--nodes", "6", "--days", "0.1", "--tasks-per-day", "2000", "--no-sizing"}
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), args, nil, &out, &errOut, nil); code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"| berth |", "| best-of-3 |", "| round-robin |", "berth strands"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := Main(context.Background(), append(args, "--json"), nil, &out, &errOut, nil); code != ExitOK {
		t.Fatalf("--json: exit %d: %s", code, errOut.String())
	}
	var rep struct {
		Results []struct{ Policy string } `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Results) != 3 {
		t.Fatalf("--json: %v %s", err, out.String())
	}
	errOut.Reset()
	if code := Main(context.Background(), []string{"sim", "--nodes", "0"}, nil, &out, &errOut, nil); code != ExitUsage || !strings.Contains(errOut.String(), "nodes") {
		t.Errorf("--nodes 0: exit %d, %q", code, errOut.String())
	}
}
