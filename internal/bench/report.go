package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Schema names the version of the JSON report below. Bump it when a field
// changes meaning; adding a field does not.
const Schema = "berth-bench/v1"

// Report is `berth bench --json FILE`: everything needed to read one run's
// numbers without the terminal it ran in.
type Report struct {
	Schema    string    `json:"schema"`     // always Schema
	StartedAt time.Time `json:"started_at"` // UTC
	// Command is the bench command line as typed (argv joined by spaces).
	Command string  `json:"command"`
	Machine Machine `json:"machine"`
	Server  Server  `json:"server"`
	Runs    int     `json:"runs"`    // measured samples per metric (burst and density: sandboxes)
	Warmups int     `json:"warmups"` // unmeasured runs before the samples
	// Metrics in the order they were measured; one per (name, runtime).
	Metrics []Metric `json:"metrics"`
}

// Machine is the host the numbers were taken on.
type Machine struct {
	Cores       int    `json:"cores"`
	MemoryBytes uint64 `json:"memory_bytes"`
	Kernel      string `json:"kernel"`
	CPUModel    string `json:"cpu_model"`
	OS          string `json:"os"`
}

// Server is the berth server measured.
type Server struct {
	URL      string   `json:"url"`
	Version  string   `json:"version"`
	Self     bool     `json:"self"`     // started by the bench on a fresh data dir
	Template string   `json:"template"` // template the sandboxes were created from
	Runtimes []string `json:"runtimes"` // runtimes measured
}

// Metric is one measured number: berth's samples and, where one exists,
// the baseline's samples from the same run.
type Metric struct {
	Name    string `json:"name"`              // e.g. "create-cold"
	Runtime string `json:"runtime,omitempty"` // runc or runsc; empty when not runtime-specific
	Unit    string `json:"unit"`              // unit of the samples: "ms" or "MiB"
	// Definition says exactly where the clock starts and stops (or what is counted).
	Definition string `json:"definition"`
	// Available is false when the feature has not landed on this server or
	// a prerequisite is missing; Reason says which. Nothing is faked.
	Available bool      `json:"available"`
	Reason    string    `json:"reason,omitempty"`
	Samples   []float64 `json:"samples"` // raw, in measurement order
	Summary   *Summary  `json:"summary,omitempty"`
	Baseline  *Baseline `json:"baseline,omitempty"`
	// Ratio is Summary.P50 / Baseline.Summary.P50 (see Ratio).
	Ratio *float64 `json:"ratio,omitempty"`
	// Derived are numbers computed from the samples, e.g. "per_second"
	// (throughput), "wall_ms" and "success_rate" (burst), "per_gib" (density).
	Derived map[string]float64 `json:"derived,omitempty"`
	// Notes say what is not a number, e.g. the fork_mode fork's children reported.
	Notes string `json:"notes,omitempty"`
	// Errors are failed samples (not counted in Samples).
	Errors []string `json:"errors,omitempty"`
}

// Baseline is the same work done without berth.
type Baseline struct {
	Name       string    `json:"name"` // e.g. "runc run"
	Definition string    `json:"definition"`
	Available  bool      `json:"available"`
	Reason     string    `json:"reason,omitempty"`
	Samples    []float64 `json:"samples"`
	Summary    *Summary  `json:"summary,omitempty"`
	Errors     []string  `json:"errors,omitempty"`
}

// Finish fills in the summaries and the ratio from the samples.
func (m *Metric) Finish() {
	if m.Samples == nil {
		m.Samples = []float64{}
	}
	m.Summary = Summarize(m.Samples)
	if b := m.Baseline; b != nil {
		if b.Samples == nil {
			b.Samples = []float64{}
		}
		b.Summary = Summarize(b.Samples)
		if r, ok := Ratio(m.Summary, b.Summary); ok {
			m.Ratio = &r
		} else {
			m.Ratio = nil
		}
	}
}

// Label is the metric's name with its runtime, e.g. "create-cold/runsc".
func (m *Metric) Label() string {
	if m.Runtime == "" {
		return m.Name
	}
	return m.Name + "/" + m.Runtime
}

func num(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "-"
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// WriteTable prints the human table: one row per metric.
func WriteTable(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "METRIC\tUNIT\tP50\tP95\tP99\tMIN\tMAX\tBASELINE P50\tRATIO\tN\t")
	for i := range r.Metrics {
		m := &r.Metrics[i]
		if !m.Available || m.Summary == nil {
			why := m.Reason
			if why == "" && len(m.Errors) > 0 {
				why = "failed: " + m.Errors[0]
			}
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t0\t  not available: %s\n", m.Label(), m.Unit, oneLine(why, 100))
			continue
		}
		s := m.Summary
		base, ratio := "-", "-"
		if m.Baseline != nil && m.Baseline.Summary != nil {
			base = num(m.Baseline.Summary.P50)
		}
		if m.Ratio != nil {
			ratio = num(*m.Ratio) + "x"
		}
		note := derivedNote(m)
		if len(m.Errors) > 0 {
			note += fmt.Sprintf(" %d failed", len(m.Errors))
		}
		if m.Notes != "" {
			note += "  " + oneLine(m.Notes, 120)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", m.Label(), m.Unit, num(s.P50), num(s.P95), num(s.P99),
			num(s.Min), num(s.Max), base, ratio, s.N, note)
	}
	return tw.Flush()
}

func derivedNote(m *Metric) string {
	if len(m.Derived) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m.Derived))
	for k := range m.Derived {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+num(m.Derived[k]))
	}
	return "  " + strings.Join(parts, " ")
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// WriteMarkdown prints the README's performance section: date, machine,
// command line, the table, and each metric's definition.
func WriteMarkdown(w io.Writer, r *Report) error {
	m := r.Machine
	fmt.Fprintf(w, "Measured %s on %d cores, %.1f GiB RAM, %s, kernel %s, with berth %s (%s).\n\n",
		r.StartedAt.UTC().Format("2006-01-02"), m.Cores, float64(m.MemoryBytes)/(1<<30), orDash(m.CPUModel), m.Kernel,
		r.Server.Version, strings.Join(r.Server.Runtimes, ", "))
	fmt.Fprintf(w, "Command: `%s` — %d runs after %d warm-up(s) per metric, template `%s`.\n\n", r.Command, r.Runs, r.Warmups, r.Server.Template)
	fmt.Fprintln(w, "| metric | runtime | unit | p50 | p95 | p99 | min | max | baseline | baseline p50 | ratio | n | notes |")
	fmt.Fprintln(w, "|---|---|---|--:|--:|--:|--:|--:|---|--:|--:|--:|---|")
	for i := range r.Metrics {
		x := &r.Metrics[i]
		rt := orDash(x.Runtime)
		if !x.Available || x.Summary == nil {
			why := x.Reason
			if why == "" && len(x.Errors) > 0 {
				why = "failed: " + x.Errors[0]
			}
			fmt.Fprintf(w, "| %s | %s | %s | not available: %s | | | | | | | | 0 | |\n", x.Name, rt, x.Unit, mdEscape(oneLine(why, 120)))
			continue
		}
		s := x.Summary
		bname, bp50, ratio := "—", "—", "—"
		if b := x.Baseline; b != nil {
			bname = b.Name
			if b.Summary != nil {
				bp50 = num(b.Summary.P50)
			} else {
				bp50 = "n/a"
			}
		}
		if x.Ratio != nil {
			ratio = num(*x.Ratio) + "×"
		}
		notes := strings.TrimSpace(derivedNote(x))
		if len(x.Errors) > 0 {
			notes = strings.TrimSpace(fmt.Sprintf("%s %d failed", notes, len(x.Errors)))
		}
		if x.Notes != "" {
			notes = strings.TrimSpace(notes + " " + mdEscape(oneLine(x.Notes, 200)))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", x.Name, rt, x.Unit,
			num(s.P50), num(s.P95), num(s.P99), num(s.Min), num(s.Max), mdEscape(bname), bp50, ratio, s.N, notes)
	}
	fmt.Fprintln(w, "\nDefinitions (where the clock starts and stops):")
	fmt.Fprintln(w)
	seen := map[string]bool{}
	for i := range r.Metrics {
		x := &r.Metrics[i]
		if seen[x.Name] {
			continue
		}
		seen[x.Name] = true
		fmt.Fprintf(w, "- **%s**: %s", x.Name, x.Definition)
		if x.Baseline != nil {
			fmt.Fprintf(w, " Baseline (%s): %s", x.Baseline.Name, x.Baseline.Definition)
		}
		fmt.Fprintln(w)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
