// Package duration is berth's one duration grammar, used by TTLs (REST
// bodies, --ttl), reaper policies, config durations and CLI flags:
//
//	90, 1.5        a plain number is seconds
//	15m, 2h30m     Go's units: h, m, s, ms, us (µs), ns
//	1d, 1d12h, 2d  plus d = 24h, alone or leading a Go duration
//	""             zero (the caller's default)
//
// Negative durations are refused. A bad value is an InvalidArgument error
// naming the field (Field) with the accepted forms.
package duration

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Forms is the human description of the grammar, for error messages.
const Forms = "e.g. 90 (seconds), 90s, 15m, 2h30m, 1d"

// Parse parses s in berth's duration grammar.
func Parse(s string) (time.Duration, error) {
	d, ok := parse(strings.TrimSpace(s))
	if !ok {
		return 0, errs.E(errs.InvalidArgument, "%q is not a duration (%s)", s, Forms)
	}
	return d, nil
}

// Field parses s like Parse; an error names field.
func Field(field, s string) (time.Duration, error) {
	d, ok := parse(strings.TrimSpace(s))
	if !ok {
		return 0, errs.Field(field, "%q is not a duration (%s)", s, Forms)
	}
	return d, nil
}

// Positive parses s and refuses zero as well: an error names field.
func Positive(field, s string) (time.Duration, error) {
	d, ok := parse(strings.TrimSpace(s))
	if !ok || d <= 0 {
		return 0, errs.Field(field, "must be a positive duration (%s), got %q", Forms, s)
	}
	return d, nil
}

func parse(s string) (time.Duration, bool) {
	if s == "" {
		return 0, true
	}
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		return seconds(n, 1)
	}
	// "1d", "1.5d", "1d12h": a leading day count, then an optional Go duration.
	if i := strings.IndexByte(s, 'd'); i > 0 {
		days, err := strconv.ParseFloat(s[:i], 64)
		if err != nil || strings.HasPrefix(s[:i], "+") || strings.HasPrefix(s[:i], "-") {
			return 0, false
		}
		d, ok := seconds(days, 24*60*60)
		if !ok {
			return 0, false
		}
		rest := s[i+1:]
		if rest == "" {
			return d, true
		}
		r, err := time.ParseDuration(rest)
		if err != nil || r < 0 || strings.HasPrefix(rest, "+") || strings.HasPrefix(rest, "-") || d > math.MaxInt64-r {
			return 0, false
		}
		return d + r, true
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, false
	}
	return d, true
}

// seconds is n units of unit seconds, refused when negative, not a number
// or beyond what a time.Duration holds (a float would wrap around).
func seconds(n, unit float64) (time.Duration, bool) {
	v := n * unit * float64(time.Second)
	if math.IsNaN(v) || v < 0 || v >= math.MaxInt64 {
		return 0, false
	}
	return time.Duration(v), true
}

// Duration is a time.Duration that reads JSON as a string in the grammar
// ("90s", "1d") or a number of seconds, and writes it as Go's string form
// ("1h30m0s", which the grammar reads back). A bad value fails decoding
// with a *json.UnmarshalTypeError, so the decoder names the field
// (internal/httpx turns it into an error naming the field and the forms).
type Duration time.Duration

// D is the plain time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var v time.Duration
	ok := false
	var n float64
	var s string
	switch {
	case json.Unmarshal(b, &n) == nil:
		v, ok = seconds(n, 1)
	case json.Unmarshal(b, &s) == nil:
		v, ok = parse(strings.TrimSpace(s))
	}
	if !ok {
		return &json.UnmarshalTypeError{Value: string(b), Type: reflect.TypeFor[Duration]()}
	}
	*d = Duration(v)
	return nil
}

// JSONForm describes what a Duration accepts, for decode errors.
func (Duration) JSONForm() string { return "duration (" + Forms + ")" }

// Flag is a flag.Value in the grammar, for CLI flags.
type Flag struct{ D *time.Duration }

func (f Flag) String() string {
	if f.D == nil {
		return ""
	}
	return f.D.String()
}

func (f Flag) Set(s string) error {
	d, err := Parse(s)
	if err != nil {
		return err
	}
	*f.D = d
	return nil
}
