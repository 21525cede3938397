package e2b

import (
	"strings"
	"testing"
)

func TestTrafficToken(t *testing.T) {
	a, b := trafficToken("envd-token-a"), trafficToken("envd-token-b")
	if a == b || !strings.HasPrefix(a, trafficTokenPrefix) || len(a) != len(trafficTokenPrefix)+48 {
		t.Fatalf("trafficToken: %q %q", a, b)
	}
	if a != trafficToken("envd-token-a") {
		t.Fatal("trafficToken is not deterministic")
	}
	if strings.Contains(a, "envd-token-a") {
		t.Fatal("traffic token contains the envd token")
	}
	if trafficToken("") != "" {
		t.Fatal("no envd token must give no traffic token")
	}
}
