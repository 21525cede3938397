package duration

import (
	"encoding/json"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"90", 90 * time.Second},
		{"1.5", 1500 * time.Millisecond},
		{" 15m ", 15 * time.Minute},
		{"90s", 90 * time.Second},
		{"500ms", 500 * time.Millisecond},
		{"2h30m", 150 * time.Minute},
		{"1.5h", 90 * time.Minute},
		{"1d", 24 * time.Hour},
		{"7d", 7 * 24 * time.Hour},
		{"1.5d", 36 * time.Hour},
		{"1d12h", 36 * time.Hour},
		{"2d30m15s", 48*time.Hour + 30*time.Minute + 15*time.Second},
		{"24h0m0s", 24 * time.Hour}, // what Duration writes reads back
	} {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, bad := range []string{"soon", "1x", "d", "-5m", "-1", "-1d", "1d-5m", "1d+5m", "+1d", "1dd", "d1", "1d2", "NaN", "1e300", "300000d", "1h1d", "m"} {
		if d, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, d)
		} else if errs.KindOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), "1d") {
			t.Errorf("Parse(%q): %v (kind %v), want InvalidArgument listing the forms", bad, err, errs.KindOf(err))
		}
		if _, err := Field("reaper.interval", bad); errs.FieldOf(err) != "reaper.interval" || !strings.HasPrefix(err.Error(), "reaper.interval: ") {
			t.Errorf("Field(%q) = %v, want it to name reaper.interval", bad, err)
		}
	}
}

func TestPositive(t *testing.T) {
	if d, err := Positive("ttl", "1d"); err != nil || d != 24*time.Hour {
		t.Errorf("Positive(1d) = %v, %v", d, err)
	}
	for _, bad := range []string{"", "0", "0s", "soon", "-1m"} {
		if _, err := Positive("max_ttl", bad); errs.FieldOf(err) != "max_ttl" {
			t.Errorf("Positive(%q) = %v, want an error naming max_ttl", bad, err)
		}
	}
}

func TestJSON(t *testing.T) {
	var v struct {
		Idle Duration `json:"idle"`
	}
	for in, want := range map[string]time.Duration{`{"idle":"1d"}`: 24 * time.Hour, `{"idle":"90s"}`: 90 * time.Second,
		`{"idle":30}`: 30 * time.Second, `{"idle":""}`: 0} {
		if err := json.Unmarshal([]byte(in), &v); err != nil || v.Idle.D() != want {
			t.Errorf("Unmarshal(%s) = %v, %v; want %v", in, v.Idle, err, want)
		}
	}
	b, _ := json.Marshal(Duration(36 * time.Hour))
	if string(b) != `"36h0m0s"` {
		t.Errorf("Marshal = %s", b)
	}
	var back Duration
	if err := json.Unmarshal(b, &back); err != nil || back.D() != 36*time.Hour {
		t.Errorf("round trip: %v, %v", back, err)
	}
	// A bad value is a type error the decoder names the field of
	// (encoding/json leaves map keys out of the path).
	var p struct {
		Policies map[string]struct {
			ClientIdle Duration `json:"client_idle"`
		} `json:"policies"`
	}
	for _, bad := range []string{`"soon"`, `"-1m"`, `true`, `-5`, `[1]`} {
		err := json.Unmarshal([]byte(`{"policies":{"x":{"client_idle":`+bad+`}}}`), &p)
		var te *json.UnmarshalTypeError
		if !asType(err, &te) || te.Field != "policies.client_idle" {
			t.Errorf("Unmarshal(%s) = %v, want a type error at policies.client_idle", bad, err)
		}
	}
}

func asType(err error, te **json.UnmarshalTypeError) bool {
	e, ok := err.(*json.UnmarshalTypeError)
	*te = e
	return ok
}

func TestFlag(t *testing.T) {
	var d time.Duration
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Var(Flag{&d}, "ttl", "time to live")
	if err := fs.Parse([]string{"--ttl", "1d2h"}); err != nil || d != 26*time.Hour {
		t.Errorf("--ttl 1d2h = %v, %v", d, err)
	}
	fs.SetOutput(new(strings.Builder))
	if err := fs.Parse([]string{"--ttl", "soon"}); err == nil {
		t.Error("--ttl soon accepted")
	}
}
