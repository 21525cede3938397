package activity

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/store"
)

// Data is an entry's kind-specific fields: the API's own type, and what a
// recorded entry stores (as JSON).
type Data = wire.ActivityData

// The kinds (wire.Activity*).
const (
	KindLifecycle = wire.ActivityLifecycle
	KindExec      = wire.ActivityExec
	KindFile      = wire.ActivityFile
	KindEgress    = wire.ActivityEgress
	KindPause     = wire.ActivityPause
	KindResume    = wire.ActivityResume
	KindReaper    = wire.ActivityReaper
	KindDropped   = wire.ActivityDropped
)

// Kinds lists every kind, for validating a filter.
var Kinds = []string{KindLifecycle, KindExec, KindFile, KindEgress, KindPause, KindResume, KindReaper, KindDropped}

// Bounds on what one entry holds: a path, an argument and the argv.
const (
	maxString = 1024
	maxArgv   = 64
	maxLine   = 200 // the summary
)

// clip bounds s to n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func clipArgv(argv []string) []string {
	out := make([]string, 0, min(len(argv), maxArgv))
	for i, a := range argv {
		if i == maxArgv {
			out = append(out, fmt.Sprintf("… %d more", len(argv)-maxArgv))
			break
		}
		out = append(out, clip(a, maxString))
	}
	return out
}

// Summarize is an entry's one line for humans.
func Summarize(kind string, d Data) string {
	var s string
	switch kind {
	case KindExec:
		s = "$ " + strings.Join(d.Argv, " ")
		switch {
		case d.Detached:
			s += " (detached, still running?)"
		case d.ExitCode != nil:
			s += fmt.Sprintf(" → exit %d", *d.ExitCode)
		case d.Signal != "":
			s += " → signal " + d.Signal
		case d.Error != "":
			s += " → error: " + d.Error
		}
		if !d.Started.IsZero() && !d.Ended.IsZero() {
			s += fmt.Sprintf(" in %s", d.Ended.Sub(d.Started).Round(time.Millisecond))
		}
	case KindFile:
		s = d.Op + " " + d.Path
		if d.To != "" {
			s += " → " + d.To
		}
		if d.Size > 0 {
			s += fmt.Sprintf(" (%d bytes)", d.Size)
		}
		if d.Source == "workspace" {
			s += " [workspace]"
		}
		if d.More > 0 {
			s += fmt.Sprintf(" and %d more changes", d.More)
		}
	case KindEgress:
		dst := d.Host
		if dst == "" {
			dst = d.DstIP
		}
		if d.DstPort != 0 {
			dst = fmt.Sprintf("%s:%d", dst, d.DstPort)
		}
		s = fmt.Sprintf("%s %s %s", d.Verdict, d.Proto, dst)
		if d.Rule != "" {
			s += " (" + d.Rule + ")"
		}
		if d.BytesOut+d.BytesIn > 0 {
			s += fmt.Sprintf(" %d↑ %d↓ bytes", d.BytesOut, d.BytesIn)
		}
	case KindPause:
		s = "paused (" + d.Mode
		if d.Requested != "" && d.Requested != d.Mode {
			s += ", " + d.Requested + " requested"
		}
		s += ")"
		if d.Message != "" {
			s += ": " + d.Message
		}
	case KindResume:
		s = "resumed"
		if d.ResumedFrom != "" {
			s += " from " + d.ResumedFrom
		}
	case KindReaper:
		s = "reaper: " + d.Attrs["action"] + " (" + d.Reason + ")"
		if d.Event == "reaper_failed" {
			s = "reaper failed: " + d.Message
		}
	case KindDropped:
		s = fmt.Sprintf("%d activity entries dropped (recorder queue full)", d.Dropped)
	default: // lifecycle
		s = d.Event
		if d.Event == "transition" {
			s = fmt.Sprintf("%s → %s", d.FromState, d.ToState)
		}
		if d.Reason != "" {
			s += " (" + d.Reason + ")"
		}
		if d.Message != "" {
			s += ": " + d.Message
		}
	}
	return clip(strings.ReplaceAll(s, "\n", " "), maxLine)
}

// modes is what a pause or resume row keeps of its sandbox (store trigger).
type modes struct {
	Requested    string `json:"requested"`
	Mode         string `json:"mode"`
	ResumedFrom  string `json:"resumed_from"`
	RestoreCount int    `json:"restore_count"`
}

// toWire turns a stored entry into the API's: recorded ones carry their
// data; joined ones are built from their event or egress row.
func toWire(e store.ActivityEntry) wire.ActivityEntry {
	out := wire.ActivityEntry{Seq: e.Seq, Time: e.Time.UTC(), Kind: e.Kind, Actor: e.Actor, Summary: e.Summary}
	switch {
	case e.Event != nil:
		ev := e.Event
		d := Data{Event: ev.Type, FromState: wire.State(ev.From), ToState: wire.State(ev.To), Reason: ev.Reason,
			Message: ev.Message, Attrs: ev.Data}
		if len(e.Data) > 0 {
			var m modes
			if json.Unmarshal(e.Data, &m) == nil {
				switch e.Kind {
				case KindPause:
					d.Mode, d.Requested = m.Mode, m.Requested
				case KindResume:
					d.ResumedFrom, d.RestoreCount = m.ResumedFrom, m.RestoreCount
				}
			}
		}
		if e.Kind == KindReaper && ev.Data["mode"] != "" {
			d.Mode = ev.Data["mode"]
		}
		out.Data, out.Summary = d, Summarize(e.Kind, d)
	case e.Egress != nil:
		g := e.Egress
		d := Data{Proto: g.Proto, Host: g.Host, DstIP: g.DstIP, DstPort: g.DstPort, Verdict: g.Verdict, Rule: g.Rule,
			Reason: g.Reason, BytesOut: g.BytesOut, BytesIn: g.BytesIn, DurationMs: g.Duration.Milliseconds()}
		out.Data, out.Summary = d, Summarize(e.Kind, d)
	case len(e.Data) > 0:
		_ = json.Unmarshal(e.Data, &out.Data) // written by Record; an old shape keeps its summary
	}
	return out
}
