package daemon

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// accounting is the daemon's live view of what every sandbox is doing (the
// reaper's signals that only exist in memory: open streams, in-flight egress,
// the last API call) plus the counters /metrics exports. The reaper loop
// (reaper.go) folds these into persisted signals every round.
type accounting struct {
	started time.Time // the daemon's start: no sandbox is idle since before it

	mu   sync.Mutex
	live map[string]*liveSignals

	// admitMu serialises quota check + insert of new sandboxes (quota.go).
	// Lock order: a sandbox's lock (Daemon.lock) may be held when admitMu is
	// taken (start, fork, snapshot); a warm pool claim holds admitMu while it
	// takes a pool member's lock, and pool members are never started, forked
	// or snapshotted by owners, so the two orders never meet on one sandbox.
	admitMu          sync.Mutex
	snapshotsPending map[string]int           // owner → captures in progress (under admitMu)
	startsPending    map[string]pendingStarts // owner → starts in progress (under admitMu)

	mMu           sync.Mutex
	creates       uint64
	createBuckets []uint64 // cumulative counts per createBounds entry
	createSum     float64
	rejections    map[string]uint64 // quota limit → count
	actions       map[[2]string]uint64
}

type liveSignals struct {
	streams    int
	egress     int
	lastClient time.Time
	lastAPI    time.Time
	lastEgress time.Time
}

// createBounds are the create-latency histogram's upper bounds, in seconds.
var createBounds = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}

func newAccounting(now time.Time) *accounting {
	return &accounting{started: now, live: map[string]*liveSignals{}, createBuckets: make([]uint64, len(createBounds)),
		rejections: map[string]uint64{}, actions: map[[2]string]uint64{}, snapshotsPending: map[string]int{},
		startsPending: map[string]pendingStarts{}}
}

func (a *accounting) entry(id string) *liveSignals {
	l, ok := a.live[id]
	if !ok {
		l = &liveSignals{}
		a.live[id] = l
	}
	return l
}

// acct returns the daemon's accounting, creating it on first use so that
// daemons built without New (tests) still work.
func (d *Daemon) acct() *accounting {
	d.acctOnce.Do(func() {
		if d.accounting == nil {
			d.accounting = newAccounting(d.cfg.Now())
		}
	})
	return d.accounting
}

// OpenStream records a client connected to sandbox id (an exec, attach,
// file or watch stream, or any in-flight request) until the returned
// function is called. The reaper never parks a sandbox with a client.
// id "" is a no-op.
func (d *Daemon) OpenStream(id string) (done func()) {
	if id == "" {
		return func() {}
	}
	a := d.acct()
	now := d.cfg.Now()
	a.mu.Lock()
	l := a.entry(id)
	l.streams++
	l.lastClient, l.lastAPI = now, now
	a.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			l.streams--
			l.lastClient = d.cfg.Now()
			a.mu.Unlock()
		})
	}
}

// OpenClientStream is OpenStream for a request made on behalf of owner ("" =
// admin): only a caller who may see the sandbox counts as its client, so
// another tenant's requests (refused anyway) cannot keep it awake.
func (d *Daemon) OpenClientStream(ctx context.Context, owner, id string) (done func()) {
	if id == "" {
		return func() {}
	}
	if _, err := d.Visible(ctx, owner, id); err != nil {
		return func() {}
	}
	return d.OpenStream(id)
}

// NoteEgress is the egress proxy's feed: inflight is the number of outbound
// requests of sandbox id in flight right now. A sandbox waiting on a long
// model call is busy, not idle.
func (d *Daemon) NoteEgress(id string, inflight int) {
	if id == "" || inflight < 0 {
		return
	}
	a := d.acct()
	a.mu.Lock()
	l := a.entry(id)
	if inflight > 0 || l.egress > 0 {
		l.lastEgress = d.cfg.Now()
	}
	l.egress = inflight
	a.mu.Unlock()
}

// noteAPI records an API call that touched sandbox id.
func (d *Daemon) noteAPI(id string) {
	a := d.acct()
	a.mu.Lock()
	a.entry(id).lastAPI = d.cfg.Now()
	a.mu.Unlock()
}

// liveOf copies the live signals of id.
func (a *accounting) liveOf(id string) liveSignals {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.live[id]; ok {
		return *l
	}
	return liveSignals{}
}

// prune drops live entries of sandboxes that no longer exist, unless a
// stream or request is still open on them.
func (a *accounting) prune(exists func(id string) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, l := range a.live {
		if !exists(id) && l.streams == 0 && l.egress == 0 {
			delete(a.live, id)
		}
	}
}

func (a *accounting) observeCreate(d time.Duration) {
	a.mMu.Lock()
	defer a.mMu.Unlock()
	a.creates++
	s := d.Seconds()
	a.createSum += s
	for i, b := range createBounds {
		if s <= b {
			a.createBuckets[i]++
		}
	}
}

func (a *accounting) observeRejection(limit string) {
	a.mMu.Lock()
	a.rejections[limit]++
	a.mMu.Unlock()
}

func (a *accounting) observeAction(action, reason string) {
	a.mMu.Lock()
	a.actions[[2]string{action, reason}]++
	a.mMu.Unlock()
}

// validateAccounting checks the reaper, quota and price config.
func (c *Config) validateAccounting() error {
	if err := c.Reaper.Validate(); err != nil {
		return err
	}
	if err := c.Quotas.Validate(); err != nil {
		return err
	}
	if err := c.Prices.Validate(); err != nil {
		return err
	}
	if c.Reaper.Interval.D() < 100*time.Millisecond {
		return errs.Field("reaper.interval", "must be at least 100ms")
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
