package daemon

import (
	"time"

	"github.com/berth-dev/berth/internal/egress"

	"github.com/berth-dev/berth/internal/sandbox"
)

// CreateRequest is everything a caller may ask for at create time. Zero
// values mean "server default".
type CreateRequest struct {
	// ID is the sandbox's id when the caller chose it (cluster mode: the
	// Sandbox object's name, from a replica's signed request); "" = a new one.
	// A sandbox made with one is bound to Config.ClusterNode and never
	// comes from a warm pool (a member has an id of its own).
	ID string
	// ClusterAdopt marks a replica's signed create that named no id (a warm
	// hit): the sandbox, claimed from a pool or made cold, is bound to
	// Config.ClusterNode with Attrs.Cluster.AdoptFrom set, since the
	// replica writes its object only from the answer (the node agent gives
	// it an adoption grace, then deletes it if no object came).
	ClusterAdopt bool
	Owner        string
	Actor        string // who asked (owner name, "e2b", "reaper", ...), for events
	Template     string // template name; "" = server default ("default")
	Runtime      string // "runc" | "runsc"; "" = server default
	TTL          time.Duration
	ExpiryAction sandbox.ExpiryAction
	Resources    sandbox.Resources
	Labels       map[string]string
	Env          map[string]string
	AutoResume   bool
	Workstation  bool // expiry action pause by default
	// Attrs are the typed feature state the sandbox starts with (lineage,
	// pool membership, idle policy, an inherited network policy ...).
	Attrs sandbox.Attrs
	// Network is the egress policy mode ("" = server default), Allow and
	// Deny its rules, Secrets the secrets to grant (netpolicy.go).
	Network              string
	Allow, Deny, Secrets []string
	// Effects marks the side effects the ledger records (internal/effects).
	Effects egress.EffectPolicy
	// FromSnapshot starts the sandbox from a snapshot's layers (snapshot.go).
	FromSnapshot string
}

// ListFilter selects sandboxes visible to an owner ("" = all, admin only).
type ListFilter struct {
	Owner        string
	States       []sandbox.State
	Labels       map[string]string
	Template     string
	CreatedAfter time.Time
	Order        string // "asc" | "desc" (default desc)
	Limit        int
	Cursor       string
}
