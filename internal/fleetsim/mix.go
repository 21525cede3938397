package fleetsim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/berth-dev/berth/internal/placement"
)

// Kind is one kind of task in a mix.
type Kind struct {
	Name  string  `json:"name"`
	Share float64 `json:"share"` // of all tasks
	// Duration: log-normal with this median and σ of log, clamped to [Min, Max].
	Median   time.Duration       `json:"median"`
	Sigma    float64             `json:"sigma"`
	Min, Max time.Duration       `json:"-"`
	Shape    placement.Resources `json:"shape"`
	// Templates: the kind's template fingerprints, drawn Zipf(ZipfS).
	Templates int     `json:"templates"`
	ZipfS     float64 `json:"-"`
	// Batch: mean tasks per arrival (a CI pipeline starts several at once,
	// within BatchSpread); 1 is single arrivals.
	Batch       float64       `json:"batch"`
	BatchSpread time.Duration `json:"-"`
	// What the request says of its duration: DeclareClass of the tasks name
	// the class, DeclareDuration give a duration (the real one ×0.7–1.4).
	Class           placement.Class `json:"class"`
	DeclareClass    float64         `json:"-"`
	DeclareDuration float64         `json:"-"`
	// Active: the share of an interactive session's time it computes; the
	// rest are idle gaps between turns (idle cost).
	Active float64 `json:"-"`
	// Tail: this share of the kind's tasks run TailMedian instead (an e2e
	// suite on a lint template: the template's durations are bimodal),
	// clamped to [5m, 3×TailMedian].
	Tail       float64       `json:"-"`
	TailMedian time.Duration `json:"-"`
}

// DefaultMix is issue 16's mix: bimodal from 5-second lint/test runs (in CI
// bursts, a few of them hour-long e2e suites on the same templates) to
// 3-hour migrations, with a share of interactive sessions that idle between
// turns.
func DefaultMix() []Kind {
	gib := int64(1024)
	return []Kind{
		{Name: "test", Share: 0.70, Median: 40 * time.Second, Sigma: 1.0, Min: 5 * time.Second, Max: 20 * time.Minute,
			Shape: placement.Resources{CPUMillis: 2000, MemoryMiB: 2 * gib, DiskMiB: 10 * gib}, Templates: 20, ZipfS: 1.2,
			Batch: 6, BatchSpread: time.Minute, Class: placement.Short, DeclareClass: 0.4,
			Tail: 0.04, TailMedian: 25 * time.Minute},
		{Name: "session", Share: 0.20, Median: 40 * time.Minute, Sigma: 0.8, Min: 5 * time.Minute, Max: 4 * time.Hour,
			Shape: placement.Resources{CPUMillis: 2000, MemoryMiB: 4 * gib, DiskMiB: 20 * gib}, Templates: 5, ZipfS: 1.0,
			Batch: 1, Class: placement.Interactive, DeclareClass: 0.8, Active: 0.3},
		{Name: "migration", Share: 0.10, Median: 75 * time.Minute, Sigma: 0.6, Min: 20 * time.Minute, Max: 3 * time.Hour,
			Shape: placement.Resources{CPUMillis: 4000, MemoryMiB: 8 * gib, DiskMiB: 40 * gib}, Templates: 10, ZipfS: 1.0,
			Batch: 1, Class: placement.Long, DeclareClass: 0.3, DeclareDuration: 0.3},
	}
}

// Task is one task of a trace.
type Task struct {
	ID          int
	Kind        int
	Arrival     time.Duration // since the start of the run
	Duration    time.Duration // how long it really runs
	Fingerprint string
	Owner       string
	Request     placement.Request // as the user sends it (no learned estimate)
	Active      float64
}

// owners in a trace, Zipf-distributed.
const owners = 50

// Trace generates a run's tasks from the mix, deterministically from seed.
// Arrivals follow a diurnal profile (a working-day peak three times the
// night's rate) by rejection sampling; a kind with Batch > 1 arrives in
// batches of geometric size.
func Trace(seed uint64, mix []Kind, days float64, tasksPerDay int) []Task {
	rng := rand.New(rand.NewPCG(seed, 0x6265727468))
	span := time.Duration(days * 24 * float64(time.Hour))
	var tasks []Task
	owner := zipf(owners, 1.1)
	for ki, k := range mix {
		n := int(math.Round(float64(tasksPerDay) * days * k.Share))
		tpl := zipf(k.Templates, k.ZipfS)
		for made := 0; made < n; {
			at := diurnalTime(rng, span)
			size := 1
			if k.Batch > 1 {
				size = 1 + geometric(rng, 1/k.Batch)
			}
			fp := fmt.Sprintf("%s-%02d", k.Name, pick(rng, tpl))
			own := fmt.Sprintf("owner-%02d", pick(rng, owner))
			for j := 0; j < size && made < n; j++ {
				arr := at
				if k.BatchSpread > 0 && j > 0 {
					arr += time.Duration(rng.Int64N(int64(k.BatchSpread)))
				}
				med := k.Median
				if k.Tail > 0 && rng.Float64() < k.Tail {
					med = k.TailMedian
				}
				d := time.Duration(float64(med) * math.Exp(k.Sigma*rng.NormFloat64()))
				if med == k.TailMedian {
					d = min(max(d, 5*time.Minute), 3*k.TailMedian)
				} else {
					d = min(max(d, k.Min), k.Max)
				}
				req := placement.Request{Resources: k.Shape, Runtime: "runsc", Fingerprint: fp, Owner: own}
				if rng.Float64() < k.DeclareClass {
					req.Class = k.Class
				}
				if rng.Float64() < k.DeclareDuration {
					req.Expected = time.Duration(float64(d) * (0.7 + 0.7*rng.Float64())).Round(time.Second)
				}
				tasks = append(tasks, Task{Kind: ki, Arrival: arr, Duration: d.Round(time.Millisecond), Fingerprint: fp, Owner: own, Request: req, Active: k.Active})
				made++
			}
		}
	}
	sort.SliceStable(tasks, func(i, j int) bool { return tasks[i].Arrival < tasks[j].Arrival })
	for i := range tasks {
		tasks[i].ID = i
		tasks[i].Request.ID = fmt.Sprintf("t%d", i)
	}
	return tasks
}

// diurnal is the relative arrival rate at a time of day: 0.33 at night,
// 1 at the peak of a 09:00–18:00 working day.
func diurnal(tod time.Duration) float64 {
	h := tod.Hours()
	if h < 7 || h > 20 {
		return 1.0 / 3
	}
	x := math.Sin(math.Pi * (h - 7) / 13)
	return 1.0/3 + (2.0/3)*x*x
}

func diurnalTime(rng *rand.Rand, span time.Duration) time.Duration {
	for {
		t := time.Duration(rng.Int64N(int64(span)))
		if rng.Float64() <= diurnal(t%(24*time.Hour)) {
			return t
		}
	}
}

// geometric: failures before the first success of probability p.
func geometric(rng *rand.Rand, p float64) int {
	n := 0
	for rng.Float64() > p && n < 1000 {
		n++
	}
	return n
}

// zipf returns the cumulative weights of ranks 1..n under Zipf(s).
func zipf(n int, s float64) []float64 {
	cum := make([]float64, n)
	sum := 0.0
	for i := range n {
		sum += 1 / math.Pow(float64(i+1), s)
		cum[i] = sum
	}
	for i := range cum {
		cum[i] /= sum
	}
	return cum
}

func pick(rng *rand.Rand, cum []float64) int {
	u := rng.Float64()
	return min(sort.SearchFloat64s(cum, u), len(cum)-1)
}
