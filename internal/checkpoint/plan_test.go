package checkpoint

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
)

// TestTimeout: the bound of a checkpoint or restore is the base plus a
// share per started GiB of the sandbox's memory limit.
func TestTimeout(t *testing.T) {
	for _, c := range []struct {
		base, perGiB time.Duration
		mib          int64
		want         time.Duration
	}{
		{10 * time.Second, 5 * time.Second, 0, 10 * time.Second},
		{10 * time.Second, 5 * time.Second, 256, 15 * time.Second},
		{10 * time.Second, 5 * time.Second, 1024, 15 * time.Second},
		{10 * time.Second, 5 * time.Second, 1025, 20 * time.Second},
		{10 * time.Second, 5 * time.Second, 4096, 30 * time.Second},
		{2 * time.Second, time.Second, 2048, 4 * time.Second},
	} {
		if got := Timeout(c.base, c.perGiB, c.mib); got != c.want {
			t.Errorf("%v + %v/GiB at %d MiB: %v, want %v", c.base, c.perGiB, c.mib, got, c.want)
		}
	}
	s, _ := New(nil, Config{CheckpointTimeout: 2 * time.Second, CheckpointTimeoutPerGiB: time.Second}, nil)
	if got := s.checkpointTimeout(&sandbox.Sandbox{Resources: sandbox.Resources{MemoryMiB: 3000}}); got != 5*time.Second {
		t.Errorf("service bound at 3000 MiB: %v, want 5s", got)
	}
}

func TestPauseModeChoice(t *testing.T) {
	if got := defaultMode(true); got != sandbox.PauseMemory {
		t.Errorf("can checkpoint: %s, want memory", got)
	}
	if got := defaultMode(false); got != sandbox.PauseDisk {
		t.Errorf("cannot checkpoint: %s, want disk", got)
	}
	if got := memoryRefusal("runc", runtime.Capabilities{Checkpoint: true}); got != "" {
		t.Errorf("a runtime that can checkpoint was refused: %q", got)
	}
	want := "runtime runc cannot checkpoint memory here: criu 3.17 is too old"
	if got := memoryRefusal("runc", runtime.Capabilities{CheckpointReason: "criu 3.17 is too old"}); got != want {
		t.Errorf("refusal %q, want %q", got, want)
	}
}

func TestPlanFork(t *testing.T) {
	can := runtime.Capabilities{Checkpoint: true}
	cannot := runtime.Capabilities{CheckpointReason: "no criu"}
	for _, c := range []struct {
		name     string
		rt       string
		caps     runtime.Capabilities
		exporter bool
		want     forkPlan
	}{
		{"runc with CRIU: memory, host upper copied after", "runc", can, false, forkPlan{memory: true}},
		{"runc exporter is ignored: its writes are on the host", "runc", can, true, forkPlan{memory: true}},
		{"runsc: memory, writes exported first", "runsc", can, true, forkPlan{memory: true, exportFirst: true}},
		{"runsc without export: memory, upper copied", "runsc", can, false, forkPlan{memory: true}},
		{"no checkpoint: files only, says why", "runc", cannot, true, forkPlan{reason: "runtime runc cannot checkpoint memory here: no criu"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := planFork(c.rt, c.caps, c.exporter); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestNextGeneration(t *testing.T) {
	for in, want := range map[int]int{0: 1, -1: 1, 1: 2, 7: 8} {
		if got := nextGeneration(in); got != want {
			t.Errorf("parent generation %d: child %d, want %d", in, got, want)
		}
	}
}

func TestResumeFrom(t *testing.T) {
	for _, c := range []struct {
		paused        sandbox.PauseMode
		cold          bool
		thaw, restore bool
		why           string
	}{
		{sandbox.PauseFreeze, false, true, false, ""},
		{sandbox.PauseFreeze, true, true, false, ""}, // frozen processes are thawed, never rebooted
		{sandbox.PauseMemory, false, false, true, ""},
		{sandbox.PauseMemory, true, false, false, "cold resume requested"},
		{sandbox.PauseDisk, false, false, false, ""},
		{"", false, false, false, ""},
	} {
		thaw, restore, why := resumeFrom(c.paused, c.cold)
		if thaw != c.thaw || restore != c.restore || why != c.why {
			t.Errorf("%q cold=%v: thaw=%v restore=%v why=%q, want %v %v %q", c.paused, c.cold, thaw, restore, why, c.thaw, c.restore, c.why)
		}
	}
}

// TestPauseSignal: a stream's signal closes when its sandbox starts
// pausing, once; a stream that asks afterwards waits for the next pause.
func TestPauseSignal(t *testing.T) {
	s, _ := New(nil, Config{}, nil)
	a, b := s.PauseSignal("sb1"), s.PauseSignal("sb1")
	other := s.PauseSignal("sb2")
	s.notifyPaused("sb1")
	for _, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		default:
			t.Fatal("signal not closed by the pause")
		}
	}
	select {
	case <-other:
		t.Fatal("another sandbox's signal closed")
	default:
	}
	next := s.PauseSignal("sb1")
	select {
	case <-next:
		t.Fatal("a signal taken after the pause is already closed")
	default:
	}
	s.notifyPaused("sb3") // nobody listening: no-op
	if !errs.Is(ErrPaused(), errs.Unavailable) {
		t.Errorf("ErrPaused() = %v", ErrPaused())
	}
}

func TestWorkstationRuntime(t *testing.T) {
	for _, c := range []struct {
		def              string
		defCan, runscCan bool
		want             string
	}{
		{"runc", false, true, "runsc"}, // the one case a workstation moves
		{"runc", true, true, "runc"},
		{"runc", false, false, "runc"}, // neither can: keep the default
		{"runc", true, false, "runc"},
		{"runsc", false, true, "runsc"},
	} {
		if got := workstationRuntime(c.def, c.defCan, c.runscCan); got != c.want {
			t.Errorf("default %s (can %v), runsc can %v: %s, want %s", c.def, c.defCan, c.runscCan, got, c.want)
		}
	}
}

func TestDiskPhase(t *testing.T) {
	for why, want := range map[string]string{"": "pause.disk", "freeze failed: x": "pause.fallback"} {
		if got := diskPhase(why); got != want {
			t.Errorf("diskPhase(%q) = %q, want %q", why, got, want)
		}
	}
}
