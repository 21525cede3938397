package sandbox

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The REST answer keeps showing Attrs as the "extra" map, and a client
// decoding it gets the typed attrs back (secrets and port hashes excepted).
func TestSandboxJSONShowsLegacyExtra(t *testing.T) {
	in := Sandbox{ID: "a", State: Running, Attrs: Attrs{Layers: []string{"l1", "l2"},
		Lineage: Lineage{Parent: "p", Generation: 1, ForkMode: "disk"}, Pool: PoolState{ClaimedFrom: "tiny"},
		Net: NetState{Secrets: []SecretGrant{{Name: "gh", Placeholder: "X"}}, Ports: map[string]PortGrant{"80": {TokenHash: "h"}}}}}
	b, err := json.Marshal(&in)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	_ = json.Unmarshal(b, &raw)
	want := map[string]any{"layers": "l1,l2", "fork_parent": "p", "fork_generation": "1", "fork_mode": "disk", "claimed_from_pool": "tiny"}
	if diff := cmp.Diff(want, raw["extra"]); diff != "" {
		t.Errorf("extra (-want +got):\n%s", diff)
	}
	for _, k := range []string{"layers", "net", "Attrs", "lineage"} {
		if _, ok := raw[k]; ok {
			t.Errorf("typed attr %q leaked as a top-level JSON field", k)
		}
	}
	var out Sandbox
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	in.Net = NetState{}
	if diff := cmp.Diff(in, out); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}
