package pool

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// Core is what the pool service needs from the lifecycle core (satisfied
// by *daemon.Daemon).
type Core interface {
	Store() store.Store
	Log() *slog.Logger
	Lock(id string) func()
	Now() time.Time
	GoBackground(name string, fn func(ctx context.Context))
	Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string)

	// CreatePoolMember creates a sandbox owned by Owner for spec, with
	// membership m in its Attrs.Pool, and returns once it is ready (or
	// failed: sb may then be non-nil and is drained).
	CreatePoolMember(ctx context.Context, spec Spec, m sandbox.PoolState) (*sandbox.Sandbox, error)
	// DrainPoolMember deletes an unclaimed member; one claimed meanwhile
	// is left alone (the delete, as Owner, no longer sees it).
	DrainPoolMember(ctx context.Context, id string) error
	// EnvdTokenHash is the access token hash a sandbox id owned by owner
	// gets.
	EnvdTokenHash(id, owner string) string
	// PublishEnv hands a sandbox's (new) environment to its agent.
	PublishEnv(sb *sandbox.Sandbox) error
	// PoolMemberMemory is a running member's memory use.
	PoolMemberMemory(ctx context.Context, runtime, id string) (uint64, error)
}

// Config is what the service takes from the server's configuration.
type Config struct {
	DefaultRuntime   string
	Runtimes         []string // configured runtime names
	DefaultResources sandbox.Resources
	MaxResources     sandbox.Resources
	// Clock times backoff, auto sizing and claim latencies; nil = time.Now.
	Clock func() time.Time
}

// Service is the warm pools of one server.
type Service struct {
	cfg  Config
	core Core
	log  *slog.Logger

	mu    sync.Mutex
	pools map[string]*warmPool // by template name
	// taken counts members handed out by Claim (under mu): a pass whose
	// scan predates a claim must not list the claimed one as ready again.
	taken uint64
	sem   chan struct{}
	kick  chan struct{}
}

// warmPool is one pool's live state.
type warmPool struct {
	spec       Spec
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

// New makes the pool service; Run keeps the pools filled.
func New(cfg Config, core Core) *Service {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return &Service{cfg: cfg, core: core, log: core.Log(), pools: map[string]*warmPool{},
		sem: make(chan struct{}, fillParallel), kick: make(chan struct{}, 1)}
}

func (s *Service) now() time.Time { return s.cfg.Clock() }

// Wake asks the loop for a pass now.
func (s *Service) Wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// key is Key with this server's defaults.
func (s *Service) key(fp, rt string, r sandbox.Resources) string {
	return Key(fp, rt, r, s.cfg.DefaultRuntime, s.cfg.DefaultResources)
}

// ClaimRequest is a create request as a claim sees it.
type ClaimRequest struct {
	Owner, Actor string
	Runtime      string
	Resources    sandbox.Resources
	Labels, Env  map[string]string
	TTL          time.Duration
	ExpiryAction sandbox.ExpiryAction
	AutoResume   bool
	// Poolable: the request differs from a plain "template, runtime,
	// resources" one only in what a claim personalises.
	Poolable bool
	// Cluster, when Node is set, binds the claimed member to a cluster
	// node in the claim's own write (a warm hit through an API replica).
	Cluster sandbox.ClusterState
}

// Claim hands out a ready member matching req, personalised for its new
// owner. ok is false on a miss (the caller creates as usual).
func (s *Service) Claim(ctx context.Context, req ClaimRequest, tpl *store.Template) (*sandbox.Sandbox, bool) {
	if req.Owner == Owner {
		return nil, false
	}
	s.mu.Lock()
	wp := s.pools[tpl.Name]
	if wp == nil {
		s.mu.Unlock()
		return nil, false
	}
	key := s.key(tpl.Fingerprint, req.Runtime, req.Resources)
	if !req.Poolable || key != wp.key {
		wp.misses++
		s.mu.Unlock()
		return nil, false
	}
	s.mu.Unlock()
	start := s.now()
	for {
		s.mu.Lock()
		if len(wp.ready) == 0 {
			wp.misses++
			wp.lastMiss = s.now()
			if wp.spec.Auto && wp.target < wp.spec.Max {
				wp.target++
				wp.lastResize = s.now()
			}
			s.mu.Unlock()
			s.Wake()
			return nil, false
		}
		id := wp.ready[0]
		wp.ready = wp.ready[1:]
		s.taken++
		s.mu.Unlock()
		if sb, err := s.claim(ctx, id, req, tpl); err == nil {
			took := s.now().Sub(start)
			s.mu.Lock()
			wp.hits++
			wp.latencies = append(wp.latencies, took)
			if len(wp.latencies) > latencySamples {
				wp.latencies = wp.latencies[len(wp.latencies)-latencySamples:]
			}
			s.mu.Unlock()
			// Refill a moment later, so starting the replacement does not
			// compete with the caller's first exec.
			time.AfterFunc(refillDelay, s.Wake)
			return sb, true
		} else if !errs.Is(err, errs.Conflict) {
			s.log.Warn("pool claim", "sandbox_id", id, "err", err)
		}
	}
}

var errNotMember = errs.E(errs.Conflict, "no longer a pool member")

// claim moves member id to req's owner in one store write, then rewrites
// its environment and records the claim.
func (s *Service) claim(ctx context.Context, id string, req ClaimRequest, tpl *store.Template) (*sandbox.Sandbox, error) {
	unlock := s.core.Lock(id)
	defer unlock()
	now := s.core.Now()
	out, err := s.core.Store().UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		if sb.Owner != Owner || sb.State != sandbox.Running || sb.TemplateID != tpl.Fingerprint {
			return errNotMember
		}
		sb.Owner, sb.Env, sb.AutoResume = req.Owner, req.Env, req.AutoResume
		sb.Labels = req.Labels
		if sb.Labels == nil {
			sb.Labels = map[string]string{}
		}
		sb.CreatedAt, sb.ExpiresAt, sb.ExpiryAction = now, now.Add(req.TTL), req.ExpiryAction
		sb.AccessTokenHash = s.core.EnvdTokenHash(sb.ID, sb.Owner)
		sb.Pool = sandbox.PoolState{ClaimedFrom: tpl.Name}
		if req.Cluster.Node != "" {
			sb.Cluster = req.Cluster
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := s.core.PublishEnv(out); err != nil {
		return nil, err
	}
	actor := req.Actor
	if actor == "" {
		actor = req.Owner
	}
	// The claim itself is durable; its event is written off the hot path
	// (one fsync less before the caller gets its sandbox).
	data := map[string]string{"template": tpl.Name, "claim_us": formatInt(s.core.Now().Sub(now).Microseconds())}
	s.core.GoBackground("pool-claim-event", func(bg context.Context) {
		s.core.Event(bg, out, actor, "pool", "claimed_from_pool", "claimed from pool "+tpl.Name, data)
	})
	return out, nil
}

// Set creates or changes the warm pool of a template.
func (s *Service) Set(ctx context.Context, spec Spec) (Status, error) {
	if err := template.ValidName(spec.Template); err != nil {
		return Status{}, errs.Field("template", "%s", err.Error())
	}
	if spec.Size < 0 || spec.Size > MaxSize {
		return Status{}, errs.Field("size", "must be between 0 and %d, got %d", MaxSize, spec.Size)
	}
	if spec.Runtime == "" {
		spec.Runtime = s.cfg.DefaultRuntime
	}
	if !slices.Contains(s.cfg.Runtimes, spec.Runtime) {
		return Status{}, errs.Field("runtime", "unknown runtime %q", spec.Runtime)
	}
	if err := sandbox.ValidateResources(spec.Resources, s.cfg.MaxResources); err != nil {
		return Status{}, err
	}
	spec.Resources = WithDefaults(spec.Resources, s.cfg.DefaultResources)
	if spec.Auto {
		if spec.Max == 0 {
			spec.Max = max(spec.Size, 1) * 4
		}
		if spec.Min < 0 || spec.Min > spec.Max || spec.Max > MaxSize {
			return Status{}, errs.Field("max", "need 0 <= min <= max <= %d, got min %d max %d", MaxSize, spec.Min, spec.Max)
		}
	} else if spec.Min != 0 || spec.Max != 0 {
		return Status{}, errs.Field("min", "min and max need auto sizing (--auto)")
	}
	specs, err := s.specs(ctx)
	if err != nil {
		return Status{}, err
	}
	specs[spec.Template] = spec
	if err := s.saveSpecs(ctx, specs); err != nil {
		return Status{}, err
	}
	s.apply(specs)
	s.Wake()
	return s.status(ctx, spec.Template)
}

// Remove drops a template's pool; its members are drained in the background.
func (s *Service) Remove(ctx context.Context, name string) error {
	specs, err := s.specs(ctx)
	if err != nil {
		return err
	}
	if _, ok := specs[name]; !ok {
		return errs.E(errs.NotFound, "no pool for template %q", name)
	}
	delete(specs, name)
	if err := s.saveSpecs(ctx, specs); err != nil {
		return err
	}
	s.apply(specs)
	s.Wake()
	return nil
}

// Has reports whether template name has a pool (a stored spec).
func (s *Service) Has(ctx context.Context, name string) (bool, error) {
	specs, err := s.specs(ctx)
	if err != nil {
		return false, err
	}
	_, ok := specs[name]
	return ok, nil
}

// List reports every pool.
func (s *Service) List(ctx context.Context) ([]Status, error) {
	specs, err := s.specs(ctx)
	if err != nil {
		return nil, err
	}
	s.apply(specs)
	names := make([]string, 0, len(specs))
	for n := range specs {
		names = append(names, n)
	}
	sort.Strings(names)
	out := []Status{}
	for _, n := range names {
		st, err := s.status(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

func (s *Service) status(ctx context.Context, name string) (Status, error) {
	s.mu.Lock()
	wp := s.pools[name]
	if wp == nil {
		s.mu.Unlock()
		return Status{}, errs.E(errs.NotFound, "no pool for template %q", name)
	}
	st := Status{Spec: wp.spec, Target: wp.target, Ready: len(wp.ready), Starting: wp.starting,
		Hits: wp.hits, Misses: wp.misses, State: wp.state, Error: wp.lastErr, RetryAt: wp.retryAt}
	lat := slices.Clone(wp.latencies)
	ready := slices.Clone(wp.ready)
	s.mu.Unlock()
	if tpl, err := s.core.Store().GetTemplate(ctx, name); err == nil {
		st.Fingerprint = tpl.Fingerprint
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		st.ClaimP50Micros = lat[len(lat)/2].Microseconds()
		st.ClaimP99Micros = lat[len(lat)*99/100].Microseconds()
	}
	for _, id := range ready {
		if m, err := s.core.PoolMemberMemory(ctx, st.Runtime, id); err == nil {
			st.IdleMemoryBytes += m
		}
	}
	return st, nil
}

func (s *Service) specs(ctx context.Context) (map[string]Spec, error) {
	specs := map[string]Spec{}
	v, err := s.core.Store().GetSetting(ctx, setting)
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

func (s *Service) saveSpecs(ctx context.Context, specs map[string]Spec) error {
	b, err := json.Marshal(specs)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "encode pool settings")
	}
	return s.core.Store().PutSetting(ctx, setting, string(b))
}

// apply brings the in-memory pools in line with the stored specs.
func (s *Service) apply(specs map[string]Spec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, spec := range specs {
		wp, ok := s.pools[name]
		if !ok {
			wp = &warmPool{state: StateFilling, lastResize: s.now()}
			s.pools[name] = wp
		}
		if wp.spec != spec {
			wp.spec = spec
			wp.target = initialTarget(spec)
			wp.failures, wp.retryAt = 0, time.Time{}
		}
	}
	for name := range s.pools {
		if _, ok := specs[name]; !ok {
			delete(s.pools, name)
		}
	}
}

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }
