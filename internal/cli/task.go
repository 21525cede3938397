package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

const taskUsage = "task ls ID [--at TIME] [--json] | task create ID --name N [--id TASK] [--step S]... [--json] | " +
	"task show ID TASK [--history] [--json] | task add-step ID TASK NAME | " +
	"task step ID TASK STEP start|done|fail|skip [--output REF] [--json] | " +
	"task ask ID TASK --question Q [--step S] [--approver owner|admin|OWNER]... [--json] | " +
	"task approve|reject ID TASK GATE [--comment C] [--json]"

// runTask: `berth task VERB ...`, the sandbox's task ledger (docs/TASKS.md).
func runTask(e *env, args []string) error {
	if len(args) == 0 {
		return usageError{"task: usage: berth " + taskUsage}
	}
	verb, args := args[0], args[1:]
	fs := flag.NewFlagSet("task "+verb, flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "JSON output")
	var (
		at, name, id, question, step, output, comment *string
		steps, approvers                              multi
		history                                       *bool
	)
	want := 0 // positional arguments
	switch verb {
	case "ls", "list":
		at = fs.String("at", "", "the ledger as it was then (RFC 3339)")
		want = 1
	case "create":
		name = fs.String("name", "", "the task's name")
		id = fs.String("id", "", "the task's id (default: from its name)")
		fs.Var(&steps, "step", "a step, in order (repeatable)")
		want = 1
	case "show":
		history = fs.Bool("history", false, "print the task's change log")
		want = 2
	case "add-step":
		want = 3
	case "step":
		output = fs.String("output", "", "a short reference to what the step produced (text or URL)")
		want = 4
	case "ask":
		question = fs.String("question", "", "what is asked")
		step = fs.String("step", "", "the step (number or name) that waits for the approval")
		fs.Var(&approvers, "approver", "who may approve: owner (default), admin, or another key's owner (repeatable)")
		want = 2
	case "approve", "reject":
		comment = fs.String("comment", "", "a comment kept with the decision")
		want = 3
	default:
		return usageError{"task: unknown verb " + verb + "; usage: berth " + taskUsage}
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != want {
		return usageError{"task " + verb + ": usage: berth " + taskUsage}
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	var t wire.Task
	switch verb {
	case "ls", "list":
		var l wire.TaskLedger
		if *at != "" {
			when, perr := time.Parse(time.RFC3339Nano, *at)
			if perr != nil {
				return usageError{"task ls: --at must be an RFC 3339 time"}
			}
			l, err = c.TasksAt(e.ctx, pos[0], when)
		} else {
			l, err = c.Tasks(e.ctx, pos[0])
		}
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, l)
		}
		printLedger(e.stdout, l)
		return nil
	case "create":
		if *name == "" {
			return usageError{"task create: --name is required"}
		}
		tid := *id
		if tid == "" {
			tid = taskID(*name)
		}
		t, err = c.CreateTask(e.ctx, pos[0], wire.TaskCreateRequest{ID: tid, Name: *name, Steps: steps})
	case "show":
		if *history {
			h, err := c.TaskHistory(e.ctx, pos[0], pos[1])
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(e.stdout, h)
			}
			printHistory(e.stdout, h)
			return nil
		}
		t, err = c.Task(e.ctx, pos[0], pos[1])
	case "add-step":
		t, err = c.AddTaskStep(e.ctx, pos[0], pos[1], pos[2])
	case "step":
		t, err = c.TaskStep(e.ctx, pos[0], pos[1], pos[2], pos[3], *output)
	case "ask":
		if *question == "" {
			return usageError{"task ask: --question is required"}
		}
		t, err = c.AskTaskGate(e.ctx, pos[0], pos[1], wire.TaskGateRequest{Question: *question, Step: *step, Approvers: approvers})
	case "approve", "reject":
		t, err = c.DecideTaskGate(e.ctx, pos[0], pos[1], pos[2], verb == "approve", *comment)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, t)
	}
	printTask(e.stdout, t)
	return nil
}

// taskID derives a task id from its name: lowercase, [a-z0-9._-], 64 bytes.
func taskID(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
		if b.Len() >= 64 {
			break
		}
	}
	id := strings.Trim(b.String(), "-")
	if id == "" {
		id = "task"
	}
	return id
}

func printLedger(w io.Writer, l wire.TaskLedger) {
	if !l.At.IsZero() {
		fmt.Fprintf(w, "ledger of %s at %s\n", l.Sandbox, l.At.Format(time.RFC3339))
	}
	if rb := l.Rollback; rb != nil {
		printRollback(w, rb)
	}
	tw := newTabWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tNAME\tSTEP\tSTATUS\tDONE\tWAITING\tFORKED")
	for _, t := range l.Tasks {
		cur, status, done := "-", "-", 0
		for i, s := range t.Steps {
			if s.Status == "done" || s.Status == "skipped" {
				done++
			}
			if cur == "-" && (s.Status == "running" || s.Status == "pending" || s.Status == "failed") {
				cur, status = fmt.Sprintf("%d %s", i+1, s.Name), s.Status
			}
		}
		waiting := 0
		for _, g := range t.Gates {
			if g.Decision == "" {
				waiting++
			}
		}
		forked := "-"
		if t.Forked != nil {
			forked = fmt.Sprintf("%s at step %d", t.Forked.Parent, t.Forked.AtStep)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\n", t.ID, t.Name, cur, status, done, len(t.Steps), waiting, forked)
	}
	tw.Flush()
}

func printRollback(w io.Writer, rb *wire.TaskRollback) {
	point := rb.Checkpoint
	if point == "" {
		point = "snapshot " + rb.Snapshot + " of " + rb.From
	} else {
		point = "checkpoint " + point
	}
	fmt.Fprintf(w, "warning: task ledger rolled back to %s (%s)", point, rb.PointAt.Format(time.RFC3339))
	if len(rb.Steps) > 0 {
		fmt.Fprintf(w, "; steps changed after it: %s", strings.Join(rb.Steps, ", "))
	}
	fmt.Fprintln(w)
}

func printTask(w io.Writer, t wire.Task) {
	fmt.Fprintf(w, "task %s: %s\n", t.ID, t.Name)
	if t.Forked != nil {
		fmt.Fprintf(w, "forked from %s at step %d (%s)\n", t.Forked.Parent, t.Forked.AtStep, t.Forked.StepName)
	}
	tw := newTabWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tSTEP\tSTATUS\tATTEMPTS\tSTARTED\tENDED\tOUTPUT")
	ts := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Local().Format("15:04:05")
	}
	for i, s := range t.Steps {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", i+1, s.Name, s.Status, s.Attempts, ts(s.StartedAt), ts(s.EndedAt), s.Output)
	}
	tw.Flush()
	for _, g := range t.Gates {
		d := g.Decision
		if d == "" {
			d = "waiting for " + strings.Join(g.Approvers, ", ")
		} else {
			d += " by " + g.DecidedBy
			if g.Comment != "" {
				d += ": " + g.Comment
			}
		}
		on := ""
		if g.Step > 0 {
			on = fmt.Sprintf(" (holds step %d)", g.Step)
		}
		fmt.Fprintf(w, "gate %s%s: %s — %s\n", g.ID, on, g.Question, d)
	}
}

func printHistory(w io.Writer, h []wire.TaskChange) {
	tw := newTabWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tACTOR\tCHANGE")
	for _, c := range h {
		what := c.Op
		switch {
		case c.Step > 0 && strings.HasPrefix(c.Op, "step_"):
			what += fmt.Sprintf(" %d", c.Step)
		case c.Op == "gate_ask":
			what += ": " + c.Question
		case c.Op == "gate_decide":
			what += " " + c.Gate + " " + c.Decision
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", c.Seq, c.At.Format(time.RFC3339), c.Actor, what)
	}
	tw.Flush()
}
