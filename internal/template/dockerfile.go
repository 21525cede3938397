package template

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Instruction is one Dockerfile instruction.
type Instruction struct {
	Line  int               // 1-based line where the instruction starts
	Cmd   string            // upper case: FROM, RUN, COPY, ...
	Raw   string            // text after the keyword, continuation lines joined
	Args  []string          // JSON (exec) form items, or the words of Raw
	JSON  bool              // Raw was a JSON array (exec form)
	Flags map[string]string // leading --name=value flags (COPY --chown=...)
}

// Dockerfile is a parsed Dockerfile: one build stage.
type Dockerfile struct {
	File  string // name used in error messages
	Steps []Instruction
}

// Instructions berth runs, and those it accepts and ignores (they describe
// an image's metadata that sandboxes have no use for).
var (
	dockerfileRun    = map[string]bool{"FROM": true, "RUN": true, "COPY": true, "ADD": true, "ENV": true, "WORKDIR": true, "USER": true, "ARG": true, "CMD": true, "ENTRYPOINT": true}
	dockerfileIgnore = map[string]bool{"LABEL": true, "EXPOSE": true, "MAINTAINER": true, "VOLUME": true, "STOPSIGNAL": true, "HEALTHCHECK": true}
)

// DockerfileError is an errs.InvalidArgument naming file:line.
func DockerfileError(file string, line int, format string, a ...any) error {
	return errs.Field("dockerfile", "%s:%d: %s", file, line, fmt.Sprintf(format, a...))
}

// ParseDockerfile parses src (named file in errors). It supports one stage
// (one FROM, optionally preceded by ARG), backslash line continuations,
// comments, and the shell and exec (JSON) forms; SHELL, ONBUILD, COPY
// --from, multi-stage builds and ADD from URLs are refused with the line
// they are on.
func ParseDockerfile(file string, src []byte) (*Dockerfile, error) {
	df := &Dockerfile{File: file}
	lines := strings.Split(strings.ReplaceAll(string(src), "\r\n", "\n"), "\n")
	seenFrom := false
	for i := 0; i < len(lines); i++ {
		start := i + 1
		text := strings.TrimSpace(lines[i])
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		// Join continuation lines; comment lines inside a continuation are dropped.
		for strings.HasSuffix(text, `\`) {
			text = strings.TrimSuffix(text, `\`)
			i++
			for i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "#") {
				i++
			}
			if i >= len(lines) {
				break
			}
			text += " " + strings.TrimSpace(lines[i])
		}
		text = strings.TrimSpace(text)
		word, rest, _ := strings.Cut(text, " ")
		if j := strings.IndexAny(word, "\t"); j >= 0 {
			word, rest = word[:j], word[j+1:]+" "+rest
		}
		cmd := strings.ToUpper(word)
		rest = strings.TrimSpace(rest)
		ins := Instruction{Line: start, Cmd: cmd, Raw: rest}
		switch {
		case dockerfileIgnore[cmd]:
			continue
		case cmd == "SHELL" || cmd == "ONBUILD":
			return nil, DockerfileError(file, start, "%s is not supported", cmd)
		case !dockerfileRun[cmd]:
			return nil, DockerfileError(file, start, "unknown instruction %q", word)
		}
		if rest == "" {
			return nil, DockerfileError(file, start, "%s needs arguments", cmd)
		}
		if err := parseArgs(&ins); err != nil {
			return nil, DockerfileError(file, start, "%s: %v", cmd, err)
		}
		switch cmd {
		case "FROM":
			if seenFrom {
				return nil, DockerfileError(file, start, "multi-stage builds (a second FROM) are not supported")
			}
			seenFrom = true
			if len(ins.Args) != 1 {
				return nil, DockerfileError(file, start, "FROM takes one image or template (FROM ... AS name is not supported)")
			}
		case "ARG":
		default:
			if !seenFrom {
				return nil, DockerfileError(file, start, "%s before FROM; the first instruction must be FROM (or ARG)", cmd)
			}
		}
		switch cmd {
		case "COPY", "ADD":
			if len(ins.Args) < 2 {
				return nil, DockerfileError(file, start, "%s needs at least one source and a destination", cmd)
			}
			for k := range ins.Flags {
				if k != "chown" && k != "chmod" {
					return nil, DockerfileError(file, start, "%s --%s is not supported (only --chown and --chmod)", cmd, k)
				}
			}
			for _, s := range ins.Args[:len(ins.Args)-1] {
				if strings.Contains(s, "://") {
					return nil, DockerfileError(file, start, "%s from a URL (%s) is not supported; download it in a RUN step", cmd, s)
				}
			}
		case "ENV":
			if _, err := envPairs(ins.Raw); err != nil {
				return nil, DockerfileError(file, start, "ENV: %v", err)
			}
		case "WORKDIR", "USER":
			if len(ins.Args) != 1 {
				return nil, DockerfileError(file, start, "%s takes one argument", cmd)
			}
		case "ARG":
			if len(ins.Args) != 1 || strings.HasPrefix(ins.Args[0], "=") {
				return nil, DockerfileError(file, start, "ARG takes one NAME or NAME=DEFAULT")
			}
		}
		df.Steps = append(df.Steps, ins)
	}
	if !seenFrom {
		return nil, DockerfileError(file, max(1, len(lines)), "no FROM instruction")
	}
	return df, nil
}

// parseArgs fills Flags, JSON and Args from Raw.
func parseArgs(ins *Instruction) error {
	raw := ins.Raw
	if ins.Cmd == "COPY" || ins.Cmd == "ADD" || ins.Cmd == "RUN" {
		for strings.HasPrefix(raw, "--") {
			f, rest, _ := strings.Cut(raw, " ")
			k, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
			if ins.Flags == nil {
				ins.Flags = map[string]string{}
			}
			ins.Flags[k] = v
			raw = strings.TrimSpace(rest)
		}
		if ins.Cmd == "RUN" && len(ins.Flags) > 0 {
			return fmt.Errorf("flags (--mount, --network ...) are not supported")
		}
		ins.Raw = raw
	}
	if strings.HasPrefix(raw, "[") && ins.Cmd != "ENV" && ins.Cmd != "ARG" {
		var items []string
		if err := json.Unmarshal([]byte(raw), &items); err == nil {
			ins.JSON, ins.Args = true, items
			return nil
		}
		if ins.Cmd != "RUN" && ins.Cmd != "CMD" && ins.Cmd != "ENTRYPOINT" {
			return fmt.Errorf("bad JSON array %s", raw)
		}
	}
	words, err := splitWords(raw)
	if err != nil {
		return err
	}
	ins.Args = words
	return nil
}

// splitWords splits on unquoted blanks, honouring "..." and '...' and
// backslash escapes (outside single quotes).
func splitWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in, quote := false, rune(0)
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case quote == 0 && (c == ' ' || c == '\t'):
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		case quote == 0 && (c == '"' || c == '\''):
			quote, in = c, true
		case quote != 0 && c == quote:
			quote = 0
		case c == '\\' && quote != '\'' && i+1 < len(rs):
			i++
			cur.WriteRune(rs[i])
			in = true
		default:
			cur.WriteRune(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if in {
		out = append(out, cur.String())
	}
	return out, nil
}

// envPairs parses ENV's "K=V K2=V2" or legacy "K V" forms.
func envPairs(raw string) ([][2]string, error) {
	words, err := splitWords(raw)
	if err != nil {
		return nil, err
	}
	if len(words) > 0 && !strings.Contains(words[0], "=") {
		k, v, _ := strings.Cut(raw, " ")
		return [][2]string{{k, strings.TrimSpace(v)}}, nil
	}
	var out [][2]string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not KEY=VALUE", w)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

// EnvPairs is envPairs after variable expansion of each value.
func (ins Instruction) EnvPairs(vars map[string]string) ([][2]string, error) {
	pairs, err := envPairs(ins.Raw)
	if err != nil {
		return nil, err
	}
	for i := range pairs {
		if pairs[i][1], err = Expand(pairs[i][1], vars); err != nil {
			return nil, err
		}
	}
	return pairs, nil
}

// Expand substitutes $NAME, ${NAME}, ${NAME:-default} and ${NAME:+alt}
// from vars, as Dockerfiles do in FROM, COPY, ADD, ENV, WORKDIR and USER;
// "\$" is a literal dollar. Unset names expand to "".
func Expand(s string, vars map[string]string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if c != '$' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		if s[i+1] == '{' {
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("unterminated ${ in %q", s)
			}
			expr := s[i+2 : i+end]
			i += end
			name, word, op := expr, "", ""
			if j := strings.Index(expr, ":-"); j >= 0 {
				name, word, op = expr[:j], expr[j+2:], "-"
			} else if j := strings.Index(expr, ":+"); j >= 0 {
				name, word, op = expr[:j], expr[j+2:], "+"
			}
			v, set := vars[name]
			switch {
			case op == "-" && (!set || v == ""):
				v = word
			case op == "+":
				if set && v != "" {
					v = word
				} else {
					v = ""
				}
			}
			b.WriteString(v)
			continue
		}
		j := i + 1
		for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || j > i+1 && s[j] >= '0' && s[j] <= '9') {
			j++
		}
		if j == i+1 {
			b.WriteByte(c)
			continue
		}
		b.WriteString(vars[s[i+1:j]])
		i = j - 1
	}
	return b.String(), nil
}
