package effects

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/store"
)

// Identity is what makes two requests "the same effect" within a lineage:
// a hash of (lineage root, task step, method, host, path, body hash). It is
// what a keyless repeat is matched by, and what a derived key is made of.
func Identity(lineage, step, method, host, path, bodySHA256 string) string {
	h := sha256.New()
	for _, s := range []string{lineage, step, method, host, path, bodySHA256} {
		// Length-prefixed: no two tuples share an encoding.
		h.Write([]byte(strconv.Itoa(len(s)) + ":" + s + ";"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// DeriveKey is the Idempotency-Key berth adds under `idempotency: derive`
// when the agent set none: stable for one identity, so a fork's or a
// restored sandbox's retry carries the same key upstream too.
func DeriveKey(identity string) string { return "berth-" + identity[:32] }

// Action is what becomes of one effectful request.
type Action int

const (
	Send   Action = iota // not a repeat: record the intent and send it
	Replay               // a repeat of a completed effect: answer from the ledger
	Refuse               // a repeat that cannot be answered: refuse, do not send
)

func (a Action) String() string {
	switch a {
	case Send:
		return "send"
	case Replay:
		return "replay"
	}
	return "refuse"
}

// Prior is an effect of the same lineage that a request may repeat.
type Prior struct {
	ID         string
	SandboxID  string
	Host       string
	State      string // store.Effect* states
	InFlight   bool   // pending and being sent by this daemon right now
	Status     int
	Replayable bool
	StartedAt  time.Time
}

// Request is the repeat-relevant part of one effectful request.
type Request struct {
	SandboxID string
	Host      string
	// Keyed: the request carries an Idempotency-Key (the agent's or a
	// derived one) and is matched by it; otherwise by its identity.
	Keyed bool
	// Windows are the spans of the sandbox's own past undone by restores.
	Windows []store.RestoreWindow
	Repeat  string // egress.RepeatReplay (default) or egress.RepeatRefuse
}

// Decision is Decide's answer: the action, the prior it matched (Replay,
// Refuse) and, for a refusal, the HTTP status and message the sandbox gets.
type Decision struct {
	Action  Action
	Prior   *Prior
	Status  int
	Message string
}

// Decide settles whether a request repeats one of priors (same lineage,
// same key or identity, newest first):
//
//   - A keyed request matches any prior with its key to the same host,
//     the sandbox's own included: a retry with the same key is the same
//     effect (that is what an idempotency key means).
//   - A keyless request matches a prior of another sandbox of the lineage
//     (a fork, a sibling, the parent, a sandbox created from a snapshot),
//     or one of its own that a restore undid; its own earlier requests in
//     the same timeline are separate effects.
//   - A matched prior that completed is replayed (repeat: replay, and its
//     answer was small enough to keep) or refused (repeat: refuse); one
//     still in flight, or whose outcome is unknown (the daemon or the
//     connection died mid-way), is refused: it may have happened.
func Decide(req Request, priors []Prior) Decision {
	for i := range priors {
		p := &priors[i]
		if req.Keyed && p.Host != req.Host {
			continue
		}
		if !req.Keyed && p.SandboxID == req.SandboxID && !Undone(req.Windows, p.StartedAt) {
			continue
		}
		if p.State == store.EffectWithdrawn {
			continue // recorded but never sent: nothing to repeat
		}
		switch {
		case p.State == store.EffectPending && p.InFlight:
			return Decision{Action: Refuse, Prior: p, Status: http.StatusConflict,
				Message: "the same effect (" + p.ID + ") is being sent right now; not sent twice"}
		case p.State != store.EffectCompleted:
			return Decision{Action: Refuse, Prior: p, Status: http.StatusConflict,
				Message: "the outcome of the same effect (" + p.ID + ") is unknown (berth or the connection stopped while it was sent): it may have happened, so it is not sent again; check the service and retry with a new Idempotency-Key"}
		case req.Repeat == egress.RepeatRefuse:
			return Decision{Action: Refuse, Prior: p, Status: http.StatusConflict,
				Message: "this effect already happened (" + p.ID + ", status " + strconv.Itoa(p.Status) + ", at " + p.StartedAt.UTC().Format(time.RFC3339) + "); the policy says repeat: refuse"}
		case !p.Replayable:
			return Decision{Action: Refuse, Prior: p, Status: http.StatusConflict,
				Message: "this effect already happened (" + p.ID + ", status " + strconv.Itoa(p.Status) + "), but its answer was too large to keep (over " + strconv.Itoa(egress.MaxReplayBody) + " bytes), so it cannot be replayed; not sent again"}
		default:
			return Decision{Action: Replay, Prior: p}
		}
	}
	return Decision{Action: Send}
}

// Undone reports whether a restore undid the moment t of a sandbox's past:
// some window has PointAt < t ≤ At.
func Undone(windows []store.RestoreWindow, t time.Time) bool {
	for _, w := range windows {
		if t.After(w.PointAt) && !t.After(w.At) {
			return true
		}
	}
	return false
}
