package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// PoolOwner owns warm pool members until a create claims one. It can never
// be a user's name (owner names start with a letter or digit).
const PoolOwner = "_pool"

// Keys in a pool member's Extra.
const (
	extraPool    = "pool"     // template name of the pool
	extraPoolKey = "pool_key" // fingerprint + shape + runtime it was made for
)

const (
	poolSetting        = "pools" // settings key: JSON map template → PoolSpec
	poolMaxSize        = 100     // most members one pool may keep
	poolFillParallel   = 2       // members started at once, across pools
	poolTick           = 250 * time.Millisecond
	poolBackoffMax     = time.Minute     // longest wait after failed starts
	poolShrinkAfter    = 2 * time.Minute // auto pools shrink after this long without a miss
	poolLatencySamples = 512
	poolRefillDelay    = 100 * time.Millisecond
)

// IsPoolMember reports whether sb is an unclaimed warm pool member: hidden
// from listings, never expired or reaped.
func IsPoolMember(sb *sandbox.Sandbox) bool { return sb.Owner == PoolOwner }

// PoolSpec is one warm pool's configuration, keyed by template name.
type PoolSpec struct {
	Template  string            `json:"template"`
	Size      int               `json:"size"`
	Runtime   string            `json:"runtime,omitempty"`
	Resources sandbox.Resources `json:"resources"`
	// Auto sizes the pool between Min and Max from demand: a miss grows
	// it by one, a quiet spell shrinks it by one.
	Auto bool `json:"auto,omitempty"`
	Min  int  `json:"min,omitempty"`
	Max  int  `json:"max,omitempty"`
}

// PoolStatus is a pool's configuration and how it is doing.
type PoolStatus struct {
	PoolSpec
	Fingerprint     string    `json:"fingerprint,omitempty"`
	Target          int       `json:"target"`
	Ready           int       `json:"ready"`
	Starting        int       `json:"starting"`
	Hits            int64     `json:"hits"`
	Misses          int64     `json:"misses"`
	ClaimP50Micros  int64     `json:"claim_p50_us"`
	ClaimP99Micros  int64     `json:"claim_p99_us"`
	IdleMemoryBytes uint64    `json:"idle_memory_bytes"`
	State           string    `json:"state"` // filling | ready | backoff | waiting
	Error           string    `json:"error,omitempty"`
	RetryAt         time.Time `json:"retry_at,omitzero"`
}

// warmPool is one pool's live state.
type warmPool struct {
	spec       PoolSpec
	key        string   // current key; "" while the template is not ready
	ready      []string // member ids, oldest first
	starting   int
	target     int
	hits       int64
	misses     int64
	latencies  []time.Duration
	failures   int
	retryAt    time.Time
	lastErr    string
	state      string
	lastMiss   time.Time
	lastResize time.Time
}

// warmPools is the daemon's pool manager.
type warmPools struct {
	mu    sync.Mutex
	pools map[string]*warmPool // by template name
	sem   chan struct{}
	kick  chan struct{}
	once  sync.Once
}

func (d *Daemon) pools() *warmPools { return d.wpools }

func newWarmPools() *warmPools {
	return &warmPools{pools: map[string]*warmPool{}, sem: make(chan struct{}, poolFillParallel), kick: make(chan struct{}, 1)}
}

func (p *warmPools) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// poolKey identifies interchangeable sandboxes: template fingerprint,
// runtime and resource shape (defaults filled in as create fills them).
func (d *Daemon) poolKey(fp, rt string, r sandbox.Resources) string {
	if rt == "" {
		rt = d.cfg.DefaultRuntime
	}
	r = d.withDefaults(r)
	return fmt.Sprintf("%s|%s|%d|%d|%d|%d", fp, rt, r.CPUMillis, r.MemoryMiB, r.DiskMiB, r.Pids)
}

func (d *Daemon) withDefaults(r sandbox.Resources) sandbox.Resources {
	def := d.cfg.DefaultResources
	if r.CPUMillis == 0 {
		r.CPUMillis = def.CPUMillis
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = def.MemoryMiB
	}
	if r.DiskMiB == 0 {
		r.DiskMiB = def.DiskMiB
	}
	if r.Pids == 0 {
		r.Pids = def.Pids
	}
	return r
}

// poolable reports whether a normalized create request differs from the
// plain "template, runtime, resources" request only in what a claim can
// personalise (owner, labels, env, expiry, auto-resume). Anything else — a
// snapshot, a network policy, any field added later — makes it a miss.
func poolable(req CreateRequest) bool {
	k := req
	k.Owner, k.Actor, k.Labels, k.Env, k.TTL, k.ExpiryAction, k.AutoResume, k.Workstation = "", "", nil, nil, 0, "", false, false
	if len(k.Extra) == 0 {
		k.Extra = nil
	}
	return reflect.DeepEqual(k, CreateRequest{Template: req.Template, Runtime: req.Runtime, Resources: req.Resources})
}

// claimFromPool hands out a ready member matching req, personalised for
// its new owner. ok is false on a miss (the caller creates as usual).
func (d *Daemon) claimFromPool(ctx context.Context, req CreateRequest, tpl *store.Template) (*sandbox.Sandbox, bool) {
	if req.Owner == PoolOwner {
		return nil, false
	}
	p := d.pools()
	p.mu.Lock()
	wp := p.pools[tpl.Name]
	if wp == nil {
		p.mu.Unlock()
		return nil, false
	}
	key := d.poolKey(tpl.Fingerprint, req.Runtime, req.Resources)
	if !poolable(req) || key != wp.key {
		wp.misses++
		p.mu.Unlock()
		return nil, false
	}
	p.mu.Unlock()
	start := time.Now()
	for {
		p.mu.Lock()
		if len(wp.ready) == 0 {
			wp.misses++
			wp.lastMiss = time.Now()
			if wp.spec.Auto && wp.target < wp.spec.Max {
				wp.target++
				wp.lastResize = time.Now()
			}
			p.mu.Unlock()
			p.wake()
			return nil, false
		}
		id := wp.ready[0]
		wp.ready = wp.ready[1:]
		p.mu.Unlock()
		if sb, err := d.claim(ctx, id, req, tpl); err == nil {
			took := time.Since(start)
			p.mu.Lock()
			wp.hits++
			wp.latencies = append(wp.latencies, took)
			if len(wp.latencies) > poolLatencySamples {
				wp.latencies = wp.latencies[len(wp.latencies)-poolLatencySamples:]
			}
			p.mu.Unlock()
			// Refill a moment later, so starting the replacement does not
			// compete with the caller's first exec.
			time.AfterFunc(poolRefillDelay, p.wake)
			return sb, true
		} else if !errs.Is(err, errs.Conflict) {
			d.log.Warn("pool claim", "sandbox_id", id, "err", err)
		}
	}
}

var errNotMember = errs.E(errs.Conflict, "no longer a pool member")

// claim moves member id to req's owner in one store write, then rewrites
// its environment and records the claim.
func (d *Daemon) claim(ctx context.Context, id string, req CreateRequest, tpl *store.Template) (*sandbox.Sandbox, error) {
	unlock := d.Lock(id)
	defer unlock()
	now := d.cfg.Now()
	out, err := d.store.UpdateSandbox(ctx, id, func(s *sandbox.Sandbox) error {
		if s.Owner != PoolOwner || s.State != sandbox.Running || s.TemplateID != tpl.Fingerprint {
			return errNotMember
		}
		s.Owner, s.Env, s.AutoResume = req.Owner, req.Env, req.AutoResume
		s.Labels = req.Labels
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.CreatedAt, s.ExpiresAt, s.ExpiryAction = now, now.Add(req.TTL), req.ExpiryAction
		s.AccessTokenHash = d.envdTokenHash(s.ID, s.Owner)
		delete(s.Extra, extraPool)
		delete(s.Extra, extraPoolKey)
		s.Extra["claimed_from_pool"] = tpl.Name
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := d.chans.writeEnv(out); err != nil {
		return nil, err
	}
	actor := req.Actor
	if actor == "" {
		actor = req.Owner
	}
	// The claim itself is durable; its event is written off the hot path
	// (one fsync less before the caller gets its sandbox).
	data := map[string]string{"template": tpl.Name, "claim_us": formatInt(time.Since(now).Microseconds())}
	d.GoBackground("pool-claim-event", func(bg context.Context) {
		d.Event(bg, out, actor, "pool", "claimed_from_pool", "claimed from pool "+tpl.Name, data)
	})
	return out, nil
}

// SetPool creates or changes the warm pool of a template.
func (d *Daemon) SetPool(ctx context.Context, spec PoolSpec) (PoolStatus, error) {
	if err := ValidTemplateName(spec.Template); err != nil {
		return PoolStatus{}, errs.Field("template", "%s", err.Error())
	}
	if spec.Size < 0 || spec.Size > poolMaxSize {
		return PoolStatus{}, errs.Field("size", "must be between 0 and %d, got %d", poolMaxSize, spec.Size)
	}
	if spec.Runtime == "" {
		spec.Runtime = d.cfg.DefaultRuntime
	}
	if _, ok := d.runtimes[spec.Runtime]; !ok {
		return PoolStatus{}, errs.Field("runtime", "unknown runtime %q", spec.Runtime)
	}
	if err := sandbox.ValidateResources(spec.Resources, d.cfg.MaxResources); err != nil {
		return PoolStatus{}, err
	}
	spec.Resources = d.withDefaults(spec.Resources)
	if spec.Auto {
		if spec.Max == 0 {
			spec.Max = max(spec.Size, 1) * 4
		}
		if spec.Min < 0 || spec.Min > spec.Max || spec.Max > poolMaxSize {
			return PoolStatus{}, errs.Field("max", "need 0 <= min <= max <= %d, got min %d max %d", poolMaxSize, spec.Min, spec.Max)
		}
	} else if spec.Min != 0 || spec.Max != 0 {
		return PoolStatus{}, errs.Field("min", "min and max need auto sizing (--auto)")
	}
	specs, err := d.poolSpecs(ctx)
	if err != nil {
		return PoolStatus{}, err
	}
	specs[spec.Template] = spec
	if err := d.savePoolSpecs(ctx, specs); err != nil {
		return PoolStatus{}, err
	}
	d.applyPoolSpecs(specs)
	d.pools().wake()
	return d.poolStatus(ctx, spec.Template)
}

// RemovePool drops a template's pool; its members are drained in the background.
func (d *Daemon) RemovePool(ctx context.Context, name string) error {
	specs, err := d.poolSpecs(ctx)
	if err != nil {
		return err
	}
	if _, ok := specs[name]; !ok {
		return errs.E(errs.NotFound, "no pool for template %q", name)
	}
	delete(specs, name)
	if err := d.savePoolSpecs(ctx, specs); err != nil {
		return err
	}
	d.applyPoolSpecs(specs)
	d.pools().wake()
	return nil
}

// Pools reports every pool.
func (d *Daemon) Pools(ctx context.Context) ([]PoolStatus, error) {
	specs, err := d.poolSpecs(ctx)
	if err != nil {
		return nil, err
	}
	d.applyPoolSpecs(specs)
	names := make([]string, 0, len(specs))
	for n := range specs {
		names = append(names, n)
	}
	sort.Strings(names)
	out := []PoolStatus{}
	for _, n := range names {
		st, err := d.poolStatus(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

func (d *Daemon) poolStatus(ctx context.Context, name string) (PoolStatus, error) {
	p := d.pools()
	p.mu.Lock()
	wp := p.pools[name]
	if wp == nil {
		p.mu.Unlock()
		return PoolStatus{}, errs.E(errs.NotFound, "no pool for template %q", name)
	}
	st := PoolStatus{PoolSpec: wp.spec, Target: wp.target, Ready: len(wp.ready), Starting: wp.starting,
		Hits: wp.hits, Misses: wp.misses, State: wp.state, Error: wp.lastErr, RetryAt: wp.retryAt}
	lat := slices.Clone(wp.latencies)
	ready := slices.Clone(wp.ready)
	p.mu.Unlock()
	if tpl, err := d.store.GetTemplate(ctx, name); err == nil {
		st.Fingerprint = tpl.Fingerprint
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		st.ClaimP50Micros = lat[len(lat)/2].Microseconds()
		st.ClaimP99Micros = lat[len(lat)*99/100].Microseconds()
	}
	if rt, ok := d.runtimes[wp.spec.Runtime]; ok {
		for _, id := range ready {
			if s, err := rt.Stats(ctx, id); err == nil {
				st.IdleMemoryBytes += s.MemoryBytes
			}
		}
	}
	return st, nil
}

func (d *Daemon) poolSpecs(ctx context.Context) (map[string]PoolSpec, error) {
	specs := map[string]PoolSpec{}
	v, err := d.store.GetSetting(ctx, poolSetting)
	if errs.Is(err, errs.NotFound) {
		return specs, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(v), &specs); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "decode pool settings")
	}
	return specs, nil
}

func (d *Daemon) savePoolSpecs(ctx context.Context, specs map[string]PoolSpec) error {
	b, err := json.Marshal(specs)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "encode pool settings")
	}
	return d.store.PutSetting(ctx, poolSetting, string(b))
}

// applyPoolSpecs brings the in-memory pools in line with the stored specs.
func (d *Daemon) applyPoolSpecs(specs map[string]PoolSpec) {
	p := d.pools()
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, spec := range specs {
		wp, ok := p.pools[name]
		if !ok {
			wp = &warmPool{state: "filling", lastResize: time.Now()}
			p.pools[name] = wp
		}
		if wp.spec != spec {
			wp.spec = spec
			wp.target = spec.Size
			if spec.Auto {
				wp.target = min(max(spec.Size, spec.Min), spec.Max)
			}
			wp.failures, wp.retryAt = 0, time.Time{}
		}
	}
	for name := range p.pools {
		if _, ok := specs[name]; !ok {
			delete(p.pools, name)
		}
	}
}
