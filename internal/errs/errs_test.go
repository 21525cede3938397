package errs

import (
	"errors"
	"fmt"
	"testing"
)

func TestKindSurvivesWrapping(t *testing.T) {
	for _, k := range Kinds() {
		err := fmt.Errorf("outer: %w", Wrap(k, errors.New("cause"), "middle"))
		if KindOf(err) != k || !Is(err, k) {
			t.Errorf("kind %v lost through wrapping: got %v", k, KindOf(err))
		}
		if k.String() == "" || (k != Internal && k.String() == "internal") {
			t.Errorf("kind %d has no name", k)
		}
	}
	if KindOf(errors.New("plain")) != Internal {
		t.Error("an unclassified error must be Internal")
	}
	if Wrap(NotFound, nil, "x") != nil {
		t.Error("Wrap(nil) must be nil")
	}
}

func TestFieldIsNamed(t *testing.T) {
	err := fmt.Errorf("create: %w", Field("memory", "must be at least %d MiB", 16))
	if FieldOf(err) != "memory" || KindOf(err) != InvalidArgument {
		t.Fatalf("FieldOf = %q, kind %v", FieldOf(err), KindOf(err))
	}
	if got := err.Error(); got != "create: memory: must be at least 16 MiB" {
		t.Errorf("message %q", got)
	}
	if FieldOf(Wrap(Internal, Field("ttl", "bad"), "outer")) != "ttl" {
		t.Error("field lost through Wrap")
	}
}
