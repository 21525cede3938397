package admission

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/store"
)

// Series grouping keys.
const (
	SeriesByOwner    = "owner"
	SeriesByTemplate = "template"
)

// MaxSeriesPoints bounds the buckets of one series request.
const MaxSeriesPoints = 1000

// SeriesQuery asks for usage over [From, To) in buckets of Step (a whole
// number of hours: the store keeps hour buckets), grouped By owner or
// template.
type SeriesQuery struct {
	By       string
	Step     time.Duration
	From, To time.Time
}

// SeriesLine is one owner's or template's cost per bucket on both bases.
type SeriesLine struct {
	Key           string    `json:"key"`
	Reserved      []float64 `json:"reserved"` // cost per bucket, reserved basis
	Active        []float64 `json:"active"`   // cost per bucket, active basis
	TotalReserved float64   `json:"total_reserved"`
	TotalActive   float64   `json:"total_active"`
}

// UsageSeries is the body of GET /v1/usage/series: Buckets are the start
// times of the buckets, every line has one value per bucket.
type UsageSeries struct {
	By      string          `json:"by"`
	Step    time.Duration   `json:"step"`
	From    time.Time       `json:"from"`
	To      time.Time       `json:"to"`
	Prices  metering.Prices `json:"prices"`
	Buckets []time.Time     `json:"buckets"`
	Lines   []SeriesLine    `json:"lines"`
}

// Normalize checks q and fills its defaults against now: To = now, From =
// To - 24h, Step = 1h; From is truncated to the Step (UTC), To rounded up
// to the Step. Bad values name their query parameter.
func (q SeriesQuery) Normalize(now time.Time) (SeriesQuery, error) {
	switch q.By {
	case "":
		q.By = SeriesByOwner
	case SeriesByOwner, SeriesByTemplate:
	default:
		return q, errs.Field("by", "must be %s or %s, got %q", SeriesByOwner, SeriesByTemplate, q.By)
	}
	if q.Step == 0 {
		q.Step = time.Hour
	}
	if q.Step < time.Hour || q.Step%time.Hour != 0 {
		return q, errs.Field("step", "must be a whole number of hours (usage is kept per hour), got %s", q.Step)
	}
	if q.To.IsZero() {
		q.To = now
	}
	if q.From.IsZero() {
		q.From = q.To.Add(-24 * time.Hour)
	}
	q.From, q.To = q.From.UTC().Truncate(q.Step), q.To.UTC()
	if t := q.To.Truncate(q.Step); t.Before(q.To) {
		q.To = t.Add(q.Step)
	} else {
		q.To = t
	}
	if !q.From.Before(q.To) {
		return q, errs.Field("from", "must be before to")
	}
	if n := q.To.Sub(q.From) / q.Step; n > MaxSeriesPoints {
		return q, errs.Field("step", "gives %d buckets from %s to %s; at most %d (take a longer step)",
			n, q.From.Format(time.RFC3339), q.To.Format(time.RFC3339), MaxSeriesPoints)
	}
	return q, nil
}

// BucketSeries prices hour rows into q's buckets (q normalized): one line
// per owner or template with any row in range, ordered by key. Pure.
func BucketSeries(rows []store.UsageHour, q SeriesQuery, p metering.Prices) UsageSeries {
	n := int(q.To.Sub(q.From) / q.Step)
	out := UsageSeries{By: q.By, Step: q.Step, From: q.From, To: q.To, Prices: p, Buckets: make([]time.Time, n),
		Lines: []SeriesLine{}}
	for i := range out.Buckets {
		out.Buckets[i] = q.From.Add(time.Duration(i) * q.Step)
	}
	lines := map[string]*SeriesLine{}
	for _, r := range rows {
		if r.Hour.Before(q.From) || !r.Hour.Before(q.To) {
			continue
		}
		key := r.Usage.Owner
		if q.By == SeriesByTemplate {
			key = r.Usage.Template
		}
		l := lines[key]
		if l == nil {
			l = &SeriesLine{Key: key, Reserved: make([]float64, n), Active: make([]float64, n)}
			lines[key] = l
		}
		i := int(r.Hour.Sub(q.From) / q.Step)
		c := metering.Price(r.Usage, p)
		l.Reserved[i] += c.Reserved
		l.Active[i] += c.Active
		l.TotalReserved += c.Reserved
		l.TotalActive += c.Active
	}
	for _, k := range sortedKeys(lines) {
		out.Lines = append(out.Lines, *lines[k])
	}
	return out
}

// UsageSeries is usage of owner ("" = every owner, admin) over time.
func (a *Service) UsageSeries(ctx context.Context, owner string, q SeriesQuery) (UsageSeries, error) {
	if owner != "" {
		if err := auth.ValidOwner("owner", owner); err != nil {
			return UsageSeries{}, err
		}
	}
	q, err := q.Normalize(a.core.Now())
	if err != nil {
		return UsageSeries{}, err
	}
	rows, err := a.core.Store().UsageHours(ctx, store.UsageHoursFilter{Owner: owner, From: q.From, To: q.To})
	if err != nil {
		return UsageSeries{}, err
	}
	return BucketSeries(rows, q, a.cfg.Prices), nil
}
