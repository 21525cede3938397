package node

import (
	"sort"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

// ActionKind is what one reconcile step does.
type ActionKind string

// The actions Decide can ask for.
const (
	// Create makes the object's sandbox on this node, with the object's id.
	Create ActionKind = "create"
	// Mirror writes the local sandbox's state (and its fields) into the object.
	Mirror ActionKind = "mirror"
	// DeleteLocal stops and deletes the local sandbox (its object is gone,
	// lost or deleted: never resurrected).
	DeleteLocal ActionKind = "delete_local"
	// DeleteObject marks deleted the object of a sandbox this node deleted
	// (a replica removes it: nodes may not delete objects).
	DeleteObject ActionKind = "delete_object"
	// MarkMissing fails an object whose sandbox this node does not have
	// (and did not just delete): the node lost it, e.g. its data dir.
	MarkMissing ActionKind = "mark_missing"
	// MarkFailed fails an object whose create cannot even be tried (its
	// expiry passed while it waited).
	MarkFailed ActionKind = "mark_failed"
	// Adopt clears a local sandbox's AdoptFrom once its object is seen (a
	// later loss of the object is then a deleted object, not a never
	// adopted one).
	Adopt ActionKind = "adopt"
)

// Reasons recorded with the actions.
const (
	ReasonObjectGone    = "object_deleted"  // the Sandbox object was deleted
	ReasonNodeLost      = "node_lost"       // the object was marked lost
	ReasonObjectDeleted = "deleted"         // the object says deleted
	ReasonMissing       = "missing_on_node" // the node has no such sandbox
	ReasonExpired       = "expired"         // it expired before the node created it
	ReasonNeverAdopted  = "never_adopted"   // made for a replica that never wrote its object
)

// Action is one step of a reconcile pass.
type Action struct {
	Kind   ActionKind
	ID     string
	Reason string
}

// Inputs is everything Decide looks at.
type Inputs struct {
	Now  time.Time
	Node string
	// Local are this node's sandboxes (every one: Decide keeps to those
	// bound to Node, so warm pool members and build sandboxes, which have
	// no object, are left alone).
	Local []*sandbox.Sandbox
	// Objects are the Sandbox objects bound to Node.
	Objects []*sandbox.Sandbox
	// Removed are ids whose local row this node deleted since their object
	// was last written (a delete's row goes right after its deleted state).
	Removed map[string]bool
	// CreateGrace is how long an object may stay creating with no local
	// sandbox before the node creates it itself: a replica creates the
	// object, then forwards the create to the node, which makes it with the
	// object's id; the agent must not race that request.
	CreateGrace time.Duration
	// AdoptGrace is how long a local sandbox made for a signed create that
	// named no id (Attrs.Cluster.AdoptFrom: a warm claim, a fork's child)
	// may have no object: the replica writes it from the node's answer, so
	// it comes after the sandbox; one still missing after the grace means
	// the replica died in between, and the sandbox is deleted.
	AdoptGrace time.Duration
}

// Decide compares this node's sandboxes with their objects and says what
// to do, in id order. It is pure: the agent's loop applies the actions.
func Decide(in Inputs) []Action {
	objs := map[string]*sandbox.Sandbox{}
	for _, o := range in.Objects {
		objs[o.ID] = o
	}
	// A local sandbox is the cluster's when it was made for an object or
	// for a replica's request (its Attrs say this node), or when an object
	// bound here names it (a fork made before forks were tagged).
	local := map[string]*sandbox.Sandbox{}
	for _, sb := range in.Local {
		if sb.Attrs.Cluster.Node == in.Node || objs[sb.ID] != nil {
			local[sb.ID] = sb
		}
	}
	var out []Action
	for id, sb := range local {
		o := objs[id]
		adopting := !sb.Attrs.Cluster.AdoptFrom.IsZero()
		if adopting && o != nil {
			out = append(out, Action{Adopt, id, ""})
		}
		switch {
		case sb.State == sandbox.Deleted:
			if o != nil && o.State != sandbox.Lost && o.State != sandbox.Deleted {
				out = append(out, Action{DeleteObject, id, ReasonObjectDeleted})
			}
		case o == nil && adopting:
			if !awaitsObject(sb, in.Now, in.AdoptGrace) {
				out = append(out, Action{DeleteLocal, id, ReasonNeverAdopted})
			}
		case o == nil:
			out = append(out, Action{DeleteLocal, id, ReasonObjectGone})
		case o.State == sandbox.Lost:
			out = append(out, Action{DeleteLocal, id, ReasonNodeLost})
		case o.State == sandbox.Deleted:
			out = append(out, Action{DeleteLocal, id, ReasonObjectDeleted})
		case Differs(sb, o):
			out = append(out, Action{Mirror, id, ""})
		}
	}
	for id, o := range objs {
		if local[id] != nil {
			continue
		}
		switch {
		case o.State == sandbox.Lost || o.State == sandbox.Failed:
			// Lost: only a delete ends it. Failed: a create that failed
			// (here or on the forwarded request) is not retried.
		case o.State == sandbox.Deleted:
			// Marked by this node (or a replica's delete in flight): a
			// replica removes the object.
		case in.Removed[id]:
			out = append(out, Action{DeleteObject, id, ReasonObjectDeleted})
		case o.State == sandbox.Creating || o.State == "pending":
			if !o.ExpiresAt.IsZero() && !in.Now.Before(o.ExpiresAt) {
				out = append(out, Action{MarkFailed, id, ReasonExpired})
			} else if o.State == "pending" || in.Now.Sub(boundAt(o)) >= in.CreateGrace {
				// Pending: the scheduler bound an object no request waits
				// on (kubectl apply), so no forwarded create is coming.
				out = append(out, Action{Create, id, ""})
			}
		default:
			// It ran here (running, paused, stopped ...) and is gone
			// without this node deleting it: say so, never boot a new one
			// under its id.
			out = append(out, Action{MarkMissing, id, ReasonMissing})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

// awaitsObject: a sandbox made for a replica's no-id create whose object
// may still come — it is still being made (the replica waits for the
// answer), or it was made (claimed, started) less than grace ago.
func awaitsObject(sb *sandbox.Sandbox, now time.Time, grace time.Duration) bool {
	if sb.State == sandbox.Creating {
		return true
	}
	from := sb.Attrs.Cluster.AdoptFrom
	if sb.StartedAt.After(from) {
		from = sb.StartedAt
	}
	return now.Sub(from) < grace
}

func boundAt(o *sandbox.Sandbox) time.Time {
	if t := o.Attrs.Cluster.BoundAt; !t.IsZero() {
		return t
	}
	return o.CreatedAt
}

// Differs reports whether the object lags behind the local sandbox in
// any field the node owns.
func Differs(local, obj *sandbox.Sandbox) bool {
	return local.State != obj.State || local.Reason != obj.Reason || local.Message != obj.Message ||
		local.PauseActual != obj.PauseActual || local.PauseRequested != obj.PauseRequested ||
		local.Runtime != obj.Runtime || local.TemplateID != obj.TemplateID ||
		!local.StartedAt.Equal(obj.StartedAt) || !local.ExpiresAt.Equal(obj.ExpiresAt) ||
		local.AccessTokenHash != obj.AccessTokenHash
}

// mirrorInto copies the fields the node owns from local into obj.
func mirrorInto(obj, local *sandbox.Sandbox) {
	obj.State, obj.Reason, obj.Message = local.State, local.Reason, local.Message
	obj.PauseActual, obj.PauseRequested = local.PauseActual, local.PauseRequested
	obj.Runtime, obj.TemplateID = local.Runtime, local.TemplateID
	obj.StartedAt, obj.ExpiresAt = local.StartedAt, local.ExpiresAt
	obj.AccessTokenHash = local.AccessTokenHash
}

// holds reports what of its resources a local sandbox keeps from others:
// CPU and memory while it has processes (a freeze pause keeps its RAM),
// disk until it is deleted (a paused or stopped sandbox keeps its workspace).
func holds(sb *sandbox.Sandbox) (cpuMem, disk bool) {
	switch sb.State {
	case sandbox.Creating, sandbox.Running, sandbox.Pausing, sandbox.Resuming:
		return true, true
	case sandbox.Paused:
		return sb.PauseActual == sandbox.PauseFreeze, true
	case sandbox.Deleted:
		return false, false
	}
	return false, true
}
