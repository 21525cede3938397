package sandbox

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// Attrs is what the features around the lifecycle record on a sandbox, typed.
// It replaced the schema-less Extra map (store migration 7 converts old
// rows); the store keeps it as one JSON column, so adding a field needs no
// schema change, but every field has a type and one owner.
type Attrs struct {
	// Layers are the layer digests (top first) the sandbox boots on, pinned
	// for its life (daemon pin.go). Empty on a sandbox that predates pinning.
	Layers []string `json:"layers,omitempty"`
	// LayersUnpinned says why Layers could not be pinned (template gone).
	LayersUnpinned string `json:"layers_unpinned,omitempty"`
	// Lineage is where the sandbox came from (fork, snapshot).
	Lineage Lineage `json:"lineage,omitzero"`
	// Pool is warm-pool membership while unclaimed, or the pool it came from.
	Pool PoolState `json:"pool,omitzero"`
	// Net is what host networking persists for the sandbox.
	Net NetState `json:"net,omitzero"`
	// UserNS is the id mapping ("HOST:SIZE") the workspace was made for, or
	// UserNSNone; "" on a sandbox that predates user namespaces.
	UserNS string `json:"userns,omitempty"`
	// IdlePolicy names the reaper policy the sandbox was created with ("": the template's or server's).
	IdlePolicy string `json:"idle_policy,omitempty"`
	// LeaseUntil holds off the reaper until then (zero: no lease).
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// PauseMillis is how long the last pause took.
	PauseMillis int64 `json:"pause_ms,omitempty"`
	// ExpiryPauseMode is the mode an expiry pause (ExpirePause) asks for;
	// "": the checkpoint service's default for the sandbox. E2B's
	// autoPauseMemory: false sets PauseDisk (filesystem-only auto-pause).
	ExpiryPauseMode PauseMode `json:"expiry_pause_mode,omitempty"`
	// PublicTraffic makes the sandbox's host-routed user ports
	// (https://<port>-<id>.<domain>, not envd) reachable without a
	// credential: E2B's network.allowPublicTraffic, set only when the
	// creator asked for it explicitly; false (berth's default) is private.
	PublicTraffic bool `json:"public_traffic,omitempty"`
	// Cluster is cluster mode's placement of the sandbox (zero on one host).
	Cluster ClusterState `json:"cluster,omitzero"`
}

// ClusterState is where cluster mode placed a sandbox and why.
type ClusterState struct {
	// Node is the node the scheduler bound the sandbox to ("" = pending).
	Node string `json:"node,omitempty"`
	// ExpectedDuration (a Go duration) and DurationClass (short |
	// interactive | long) are what placement was told, when it was.
	ExpectedDuration string    `json:"expected_duration,omitempty"`
	DurationClass    string    `json:"duration_class,omitempty"`
	BoundAt          time.Time `json:"bound_at,omitzero"`
	LostAt           time.Time `json:"lost_at,omitzero"`
	// AdoptFrom is set, on the node, on a sandbox made for a replica's
	// signed request that named no id (a warm pool claim, a fork's child):
	// its object is written by the replica only from the node's answer, so
	// until the node's adoption grace has passed from then, having no
	// object is not yet a reason to delete it. Cleared once the object is seen.
	AdoptFrom time.Time `json:"adopt_from,omitzero"`
}

// UserNSNone is Attrs.UserNS of a sandbox made without a user namespace.
const UserNSNone = "none"

// Lineage is a sandbox's ancestry; zero for one booted from a template.
type Lineage struct {
	Snapshot   string `json:"snapshot,omitempty"`   // snapshot it was started from
	Parent     string `json:"parent,omitempty"`     // sandbox it was forked from
	Generation int    `json:"generation,omitempty"` // 0 = not a fork
	ForkMode   string `json:"fork_mode,omitempty"`  // memory | disk
}

// PoolState is a sandbox's relation to a warm pool.
type PoolState struct {
	Member      string `json:"member,omitempty"`       // template whose pool holds it, while unclaimed
	Key         string `json:"key,omitempty"`          // fingerprint + shape + runtime it was made for
	ClaimedFrom string `json:"claimed_from,omitempty"` // template pool it was claimed from
}

// NetState is what host networking persists: the policy, secret grants,
// exposed ports and the namespace path.
type NetState struct {
	Policy    json.RawMessage      `json:"policy,omitempty"` // egress.MarshalPolicy; empty is deny-all
	Secrets   []SecretGrant        `json:"secrets,omitempty"`
	Ports     map[string]PortGrant `json:"ports,omitempty"` // by port number
	NetnsPath string               `json:"netns_path,omitempty"`
	// LeaseTTL is how long each credential lease of the sandbox lives (0:
	// as long as the sandbox; internal/leases); forks inherit it.
	LeaseTTL time.Duration `json:"lease_ttl,omitempty"`
}

// SecretGrant is a secret granted to a sandbox: its name and the
// placeholder the sandbox sees in env var Name. The value is looked up at boot.
type SecretGrant struct {
	Name        string `json:"name"`
	Placeholder string `json:"placeholder"`
}

// PortGrant is an exposed port as stored: only its token's hash.
type PortGrant struct {
	TokenHash string    `json:"token_hash,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// The keys of the old Extra map, which the REST answer still shows under
// "extra" for API compatibility (LegacyExtra) and migration 7 reads.
const (
	keyLayers         = "layers"
	keyLayersUnpinned = "layers_unpinned"
	keySnapshot       = "snapshot"
	keyParent         = "fork_parent"
	keyGeneration     = "fork_generation"
	keyForkMode       = "fork_mode"
	keyPool           = "pool"
	keyPoolKey        = "pool_key"
	keyClaimedFrom    = "claimed_from_pool"
	keyPolicy         = "network_policy"
	keySecrets        = "secrets"
	keyPorts          = "ports"
	keyNetns          = "netns_path"
	keyUserNS         = "userns"
	keyIdlePolicy     = "idle_policy"
	keyLeaseUntil     = "lease_until"
	keyPauseMillis    = "pause_ms"
)

// LegacyExtra renders a as the string map the API answered under "extra"
// before the typed model, so existing clients keep reading it. Secrets and
// port token hashes are not shown (they never were meant for clients).
func (a Attrs) LegacyExtra() map[string]string {
	m := map[string]string{}
	set := func(k, v string) {
		if v != "" {
			m[k] = v
		}
	}
	set(keyLayers, strings.Join(a.Layers, ","))
	set(keyLayersUnpinned, a.LayersUnpinned)
	set(keySnapshot, a.Lineage.Snapshot)
	set(keyParent, a.Lineage.Parent)
	if a.Lineage.Generation > 0 {
		set(keyGeneration, strconv.Itoa(a.Lineage.Generation))
	}
	set(keyForkMode, a.Lineage.ForkMode)
	set(keyPool, a.Pool.Member)
	set(keyPoolKey, a.Pool.Key)
	set(keyClaimedFrom, a.Pool.ClaimedFrom)
	set(keyPolicy, string(a.Net.Policy))
	set(keyNetns, a.Net.NetnsPath)
	set(keyUserNS, a.UserNS)
	set(keyIdlePolicy, a.IdlePolicy)
	if !a.LeaseUntil.IsZero() {
		set(keyLeaseUntil, a.LeaseUntil.UTC().Format(time.RFC3339Nano))
	}
	if a.PauseMillis > 0 {
		set(keyPauseMillis, strconv.FormatInt(a.PauseMillis, 10))
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// AttrsFromExtra converts an old Extra map (store migration 7). It returns
// the keys it could not place — unknown ones, and values that do not parse —
// so the caller can keep them on record instead of losing them silently.
func AttrsFromExtra(extra map[string]string) (Attrs, map[string]string) {
	var a Attrs
	left := map[string]string{}
	for k, v := range extra {
		ok := true
		switch k {
		case keyLayers:
			if v != "" {
				a.Layers = strings.Split(v, ",")
			}
		case keyLayersUnpinned:
			a.LayersUnpinned = v
		case keySnapshot:
			a.Lineage.Snapshot = v
		case keyParent:
			a.Lineage.Parent = v
		case keyGeneration:
			g, err := strconv.Atoi(v)
			a.Lineage.Generation, ok = g, err == nil && g >= 0
		case keyForkMode:
			a.Lineage.ForkMode = v
		case keyPool:
			a.Pool.Member = v
		case keyPoolKey:
			a.Pool.Key = v
		case keyClaimedFrom:
			a.Pool.ClaimedFrom = v
		case keyPolicy:
			ok = v == "" || json.Valid([]byte(v))
			if ok && v != "" {
				a.Net.Policy = json.RawMessage(v)
			}
		case keySecrets:
			ok = v == "" || json.Unmarshal([]byte(v), &a.Net.Secrets) == nil
		case keyPorts:
			ok = v == "" || json.Unmarshal([]byte(v), &a.Net.Ports) == nil
		case keyNetns:
			a.Net.NetnsPath = v
		case keyUserNS:
			a.UserNS = v
		case keyIdlePolicy:
			a.IdlePolicy = v
		case keyLeaseUntil:
			t, err := time.Parse(time.RFC3339Nano, v)
			a.LeaseUntil, ok = t, err == nil
		case keyPauseMillis:
			n, err := strconv.ParseInt(v, 10, 64)
			a.PauseMillis, ok = n, err == nil
		default:
			ok = false
		}
		if !ok {
			left[k] = v
		}
	}
	return a, left
}
