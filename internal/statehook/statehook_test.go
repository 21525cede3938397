package statehook

import (
	"context"
	"errors"
	"testing"

	"github.com/berth-dev/berth/internal/sandbox"
)

func TestBusOrderAndErrors(t *testing.T) {
	var b Bus
	var got []string
	var reported []string
	b.OnError = func(_ context.Context, ev Event, hook string, err error) {
		reported = append(reported, hook+":"+err.Error())
	}
	b.Register("a", Func(func(_ context.Context, ev Event) error { got = append(got, "a:"+string(ev.Phase)); return nil }))
	b.Register("b", Func(func(_ context.Context, ev Event) error { got = append(got, "b"); return errors.New("boom") }))
	b.Register("c", Func(func(_ context.Context, ev Event) error { got = append(got, "c"); return nil }))
	err := b.Fire(context.Background(), Event{Phase: Paused, Sandbox: &sandbox.Sandbox{ID: "x"}})
	if err == nil || err.Error() != "boom" {
		t.Fatalf("Fire error = %v, want boom", err)
	}
	if want := []string{"a:paused", "b", "c"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("order = %v, want %v (a failing hook must not stop the next)", got, want)
	}
	if len(reported) != 1 || reported[0] != "b:boom" {
		t.Fatalf("reported = %v", reported)
	}
	var nilBus *Bus
	if err := nilBus.Fire(context.Background(), Event{Phase: Paused}); err != nil {
		t.Fatal(err)
	}
}
