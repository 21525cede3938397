// Package berthv1 is cluster mode's API: the berth.dev/v1alpha1 custom
// resources (deploy/crds holds their CustomResourceDefinitions, which must
// say what these types say: TestCRDsMatchTypes).
//
// The shape follows kubernetes-sigs/agent-sandbox (Sandbox, SandboxTemplate,
// SandboxWarmPool) where the ideas are the same: a Sandbox's spec is what
// was asked, its status what a node made of it, with Kubernetes conditions.
// berth adds what its lifecycle has and that project's does not: pause
// modes, expiry, an expected duration for placement, and the Node object
// its own node agent (not the kubelet) keeps.
package berthv1

import (
	"time"

	"github.com/berth-dev/berth/internal/kube"
)

// Group and version of every kind here.
const (
	Group      = "berth.dev"
	Version    = "v1alpha1"
	APIVersion = Group + "/" + Version
)

// The REST collections.
var (
	Sandboxes = kube.Resource{Group: Group, Version: Version, Plural: "sandboxes", Namespaced: true}
	Templates = kube.Resource{Group: Group, Version: Version, Plural: "templates", Namespaced: true}
	WarmPools = kube.Resource{Group: Group, Version: Version, Plural: "warmpools", Namespaced: true}
	Nodes     = kube.Resource{Group: Group, Version: Version, Plural: "nodes", Namespaced: true}
	// Records hold the store tables that are not first-class objects
	// (events, keys, usage, ledgers...): internal/kubestore.
	Records = kube.Resource{Group: Group, Version: Version, Plural: "records", Namespaced: true}
)

// Labels berth sets on its objects (for selectors).
const (
	LabelOwner    = "berth.dev/owner"    // a Sandbox's owner (label-safe form: kubestore.LabelValue)
	LabelNode     = "berth.dev/node"     // the Node a Sandbox is bound to
	LabelState    = "berth.dev/state"    // a Sandbox's state
	LabelTemplate = "berth.dev/template" // a Sandbox's template name
)

// Resources is what a sandbox is given.
type Resources struct {
	CPUMillis int64 `json:"cpuMillis,omitempty"`
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
	DiskMiB   int64 `json:"diskMiB,omitempty"`
	Pids      int64 `json:"pids,omitempty"`
}

// Sandbox is one isolated machine.
type Sandbox struct {
	kube.TypeMeta   `json:",inline"`
	kube.ObjectMeta `json:"metadata"`
	Spec            SandboxSpec   `json:"spec"`
	Status          SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandboxes.
type SandboxList struct {
	kube.TypeMeta `json:",inline"`
	kube.ListMeta `json:"metadata"`
	Items         []Sandbox `json:"items"`
}

// Duration classes (internal/placement).
const (
	ClassShort       = "short"
	ClassInteractive = "interactive"
	ClassLong        = "long"
)

// SandboxSpec is what was asked for.
type SandboxSpec struct {
	Owner               string            `json:"owner"`
	Template            string            `json:"template"`
	TemplateFingerprint string            `json:"templateFingerprint,omitempty"`
	Runtime             string            `json:"runtime,omitempty"` // runc | runsc
	Resources           Resources         `json:"resources,omitempty"`
	Labels              map[string]string `json:"labels,omitempty"` // the sandbox's own labels (not Kubernetes labels)
	ExpiresAt           *time.Time        `json:"expiresAt,omitempty"`
	ExpiryAction        string            `json:"expiryAction,omitempty"` // stop | pause | delete
	// ExpectedDuration (a Go duration) and DurationClass feed placement.
	ExpectedDuration string         `json:"expectedDuration,omitempty"`
	DurationClass    string         `json:"durationClass,omitempty"`
	Network          *NetworkPolicy `json:"network,omitempty"`
	// NodeName binds the sandbox to a Node; set once by the scheduler.
	NodeName string `json:"nodeName,omitempty"`
}

// NetworkPolicy is a sandbox's egress policy.
type NetworkPolicy struct {
	Mode    string   `json:"mode,omitempty"` // egress.Mode: deny-all | allow-all | rules
	Allow   []string `json:"allow,omitempty"`
	Deny    []string `json:"deny,omitempty"`
	Secrets []string `json:"secrets,omitempty"`
}

// SandboxStatus is what a node made of it.
type SandboxStatus struct {
	// State is berth's lifecycle state (creating, running, paused, ...),
	// plus "pending" (not yet bound) and "lost" (its node stopped renewing
	// its Lease; never resurrected).
	State              string           `json:"state,omitempty"`
	Reason             string           `json:"reason,omitempty"`
	PauseMode          string           `json:"pauseMode,omitempty"`
	Node               string           `json:"node,omitempty"`
	IP                 string           `json:"ip,omitempty"`
	Timings            SandboxTimings   `json:"timings,omitempty"`
	Conditions         []kube.Condition `json:"conditions,omitempty"`
	ObservedGeneration int64            `json:"observedGeneration,omitempty"`
}

// SandboxTimings are the lifecycle's times.
type SandboxTimings struct {
	CreatedAt *time.Time `json:"createdAt,omitempty"`
	BoundAt   *time.Time `json:"boundAt,omitempty"`
	StartedAt *time.Time `json:"startedAt,omitempty"`
	PausedAt  *time.Time `json:"pausedAt,omitempty"`
	LostAt    *time.Time `json:"lostAt,omitempty"`
}

// Sandbox condition types.
const (
	CondScheduled = "Scheduled" // bound to a node (False + reason Unschedulable while waiting)
	CondReady     = "Ready"     // running and answering
	CondLost      = "NodeLost"  // its node's Lease expired
)

// Cluster-level states on top of internal/sandbox's.
const (
	StatePending = "pending"
	StateLost    = "lost"
)

// Template is an environment sandboxes start from.
type Template struct {
	kube.TypeMeta   `json:",inline"`
	kube.ObjectMeta `json:"metadata"`
	Spec            TemplateSpec   `json:"spec"`
	Status          TemplateStatus `json:"status,omitempty"`
}

// TemplateList is a list of Templates.
type TemplateList struct {
	kube.TypeMeta `json:",inline"`
	kube.ListMeta `json:"metadata"`
	Items         []Template `json:"items"`
}

// TemplateSpec is a template's definition.
type TemplateSpec struct {
	// Name is berth's template name (the object's name is a DNS-safe form of it).
	Name      string            `json:"name"`
	Source    string            `json:"source,omitempty"` // image reference, Dockerfile, rootfs path
	StartCmd  []string          `json:"startCmd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	User      string            `json:"user,omitempty"`
	Resources Resources         `json:"resources,omitempty"`
}

// TemplateStatus is a template's build.
type TemplateStatus struct {
	State       string           `json:"state,omitempty"` // building | ready | failed
	Fingerprint string           `json:"fingerprint,omitempty"`
	Layers      []string         `json:"layers,omitempty"` // layer digests, top first
	Progress    string           `json:"progress,omitempty"`
	Error       string           `json:"error,omitempty"`
	Conditions  []kube.Condition `json:"conditions,omitempty"`
}

// WarmPool keeps ready sandboxes of a template.
type WarmPool struct {
	kube.TypeMeta   `json:",inline"`
	kube.ObjectMeta `json:"metadata"`
	Spec            WarmPoolSpec   `json:"spec"`
	Status          WarmPoolStatus `json:"status,omitempty"`
}

// WarmPoolList is a list of WarmPools.
type WarmPoolList struct {
	kube.TypeMeta `json:",inline"`
	kube.ListMeta `json:"metadata"`
	Items         []WarmPool `json:"items"`
}

// WarmPoolSpec: Min..Max ready members, sized per node from the observed
// claim rate (placement.PoolSize) in between.
type WarmPoolSpec struct {
	Template  string    `json:"template"`
	Runtime   string    `json:"runtime,omitempty"`
	Resources Resources `json:"resources,omitempty"`
	Min       int32     `json:"min,omitempty"`
	Max       int32     `json:"max,omitempty"`
}

// WarmPoolStatus counts ready members.
type WarmPoolStatus struct {
	Ready      int32            `json:"ready"`
	PerNode    map[string]int32 `json:"perNode,omitempty"`
	Conditions []kube.Condition `json:"conditions,omitempty"`
}

// Node is one host running `berth node`.
type Node struct {
	kube.TypeMeta   `json:",inline"`
	kube.ObjectMeta `json:"metadata"`
	Spec            NodeSpec   `json:"spec"`
	Status          NodeStatus `json:"status,omitempty"`
}

// NodeList is a list of Nodes.
type NodeList struct {
	kube.TypeMeta `json:",inline"`
	kube.ListMeta `json:"metadata"`
	Items         []Node `json:"items"`
}

// NodeSpec is set by the operator (labels for selectors are metadata labels).
type NodeSpec struct {
	// Unschedulable keeps new sandboxes off the node (cordon).
	Unschedulable bool `json:"unschedulable,omitempty"`
}

// NodeStatus is what the node agent reports.
type NodeStatus struct {
	// Address is the node's peer endpoint (https://host:port) and
	// CertSHA256 the hex SHA-256 of its certificate (DER), which API
	// replicas pin (internal/cluster/peer).
	Address    string        `json:"address,omitempty"`
	CertSHA256 string        `json:"certSHA256,omitempty"`
	Capacity   Resources     `json:"capacity,omitempty"`
	Allocated  Resources     `json:"allocated,omitempty"`
	Runtimes   []NodeRuntime `json:"runtimes,omitempty"`
	// CachedTemplates are the template fingerprints whose layers the node has.
	CachedTemplates []string         `json:"cachedTemplates,omitempty"`
	WarmPools       []NodeWarmPool   `json:"warmPools,omitempty"`
	Version         string           `json:"version,omitempty"`
	Heartbeat       *time.Time       `json:"heartbeat,omitempty"`
	Conditions      []kube.Condition `json:"conditions,omitempty"`
}

// NodeRuntime is one runtime and what it can do ("memory-checkpoint", ...).
type NodeRuntime struct {
	Name         string   `json:"name"`
	Capabilities []string `json:"capabilities,omitempty"`
}

// NodeWarmPool counts a node's ready pool members of one fingerprint.
type NodeWarmPool struct {
	Fingerprint string `json:"fingerprint"`
	Ready       int32  `json:"ready"`
}

// Node condition types.
const (
	CondNodeReady = "Ready" // False with reason LeaseExpired when lost
)

// NodeLeaseName is the Lease a node renews.
func NodeLeaseName(node string) string { return "berth-node-" + node }

// Record is one row of a store table that is not a first-class object
// (API keys, events, usage, ledgers ...), kept by internal/kubestore.
// Selected by the labels berth.dev/table and the table's own keys.
type Record struct {
	kube.TypeMeta   `json:",inline"`
	kube.ObjectMeta `json:"metadata"`
	Spec            RecordSpec `json:"spec"`
}

// RecordList is a list of Records.
type RecordList struct {
	kube.TypeMeta `json:",inline"`
	kube.ListMeta `json:"metadata"`
	Items         []Record `json:"items"`
}

// RecordSpec: Key is the row's key within its table, Seq its sequence
// number where the table has one, Data the row (JSON).
type RecordSpec struct {
	Table string `json:"table"`
	Key   string `json:"key"`
	Seq   int64  `json:"seq,omitempty"`
	Data  string `json:"data"`
}

// LabelTable selects a table's records.
const LabelTable = "berth.dev/table"
