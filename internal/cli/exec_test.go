package cli

import "testing"

func TestSignalNumber(t *testing.T) {
	for name, want := range map[string]int{"killed": 9, "terminated": 15, "interrupt": 2, "segmentation fault": 11, "hangup": 1, "broken pipe": 13} {
		if got := signalNumber(name); got != want {
			t.Errorf("signalNumber(%q) = %d, want %d", name, got, want)
		}
	}
}
