package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the test binary stand in for berth itself: invoked with
// BERTH_CLI_AS_BERTH=1 it is `berth`, so a real shell can run
// `berth completion bash` through the same Main as the binary.
func TestMain(m *testing.M) {
	if os.Getenv("BERTH_CLI_AS_BERTH") == "1" {
		os.Exit(Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr, nil))
	}
	os.Exit(m.Run())
}

// berthOnPath puts a `berth` (this test binary) first on PATH.
func berthOnPath(t *testing.T) []string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(self, filepath.Join(dir, "berth")); err != nil {
		t.Fatal(err)
	}
	return append(os.Environ(), "BERTH_CLI_AS_BERTH=1", "PATH="+dir+":"+os.Getenv("PATH"))
}

// complete asks the real bash, with berth's completion loaded, for the
// completions of the words typed so far (the last one may be partial).
func complete(t *testing.T, env []string, words ...string) []string {
	t.Helper()
	script := `source <(berth completion bash) || exit 9
complete -p berth || exit 8
COMP_WORDS=(` + shellWords(words) + `)
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
_berth
printf '%s\n' "${COMPREPLY[@]}"`
	cmd := exec.Command("bash", "--norc", "--noprofile", "-c", script)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "complete ") || !strings.HasSuffix(lines[0], " berth") {
		t.Fatalf("complete -p berth printed %q", lines)
	}
	return lines[1:]
}

func shellWords(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

func TestBashCompletion(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("bash is needed to test the bash completion:", err)
	}
	env := berthOnPath(t)
	for _, c := range []struct {
		words      []string
		want, not_ []string
	}{
		{words: []string{"berth", "cr"}, want: []string{"create"}, not_: []string{"exec"}},
		{words: []string{"berth", "p"}, want: []string{"pause", "pool", "port"}},
		{words: []string{"berth", ""}, want: []string{"create", "exec", "completion", "template", "help"}},
		{words: []string{"berth", "create", "--te"}, want: []string{"--template"}, not_: []string{"--ttl"}},
		{words: []string{"berth", "create", "--"}, want: []string{"--template", "--ttl", "--network", "--json"}},
		{words: []string{"berth", "exec", "-"}, want: []string{"-i", "-t", "--env", "--timeout"}},
		{words: []string{"berth", "template", ""}, want: []string{"ls", "import", "pull", "build", "rm", "from-snapshot"}},
		{words: []string{"berth", "template", "build", "--no"}, want: []string{"--no-cache"}},
		{words: []string{"berth", "quota", "s"}, want: []string{"set"}},
		{words: []string{"berth", "completion", ""}, want: []string{"bash", "zsh", "fish"}},
		{words: []string{"berth", "help", "ex"}, want: []string{"exec", "extend"}},
	} {
		got := complete(t, env, c.words...)
		set := map[string]bool{}
		for _, g := range got {
			set[g] = true
		}
		for _, w := range c.want {
			if !set[w] {
				t.Errorf("completing %q: %q missing from %q", c.words, w, got)
			}
		}
		for _, w := range c.not_ {
			if set[w] {
				t.Errorf("completing %q: %q should not be offered (%q)", c.words, w, got)
			}
		}
	}
}

func TestZshAndFishCompletion(t *testing.T) {
	for _, sh := range []string{"zsh", "fish"} {
		var out, errOut bytes.Buffer
		if code := Main(context.Background(), []string{"completion", sh}, nil, &out, &errOut, nil); code != ExitOK {
			t.Fatalf("completion %s: exit %d: %s", sh, code, errOut.String())
		}
		for _, want := range []string{"create", "--template", "from-snapshot", "--no-cache"} {
			if !strings.Contains(out.String(), strings.TrimPrefix(want, "--")) {
				t.Errorf("%s completion lacks %s", sh, want)
			}
		}
		if p, err := exec.LookPath(sh); err == nil {
			check := exec.Command(p, "-n")
			if sh == "fish" {
				check = exec.Command(p, "--no-execute")
			}
			check.Stdin = &out
			if b, err := check.CombinedOutput(); err != nil {
				t.Errorf("%s -n rejects the script: %v\n%s", sh, err, b)
			}
		}
	}
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"completion", "tcsh"}, nil, &out, &errOut, nil); code != ExitUsage {
		t.Errorf("completion tcsh: exit %d, want %d", code, ExitUsage)
	}
}
