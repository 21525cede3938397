package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/berth-dev/berth/internal/lazyregexp"
)

// Shell completion is derived from the verb table that `berth help` prints:
// each verb's subcommands and flags are read off its usage line, so a verb
// or flag added there completes without further work.

const completionUsage = "completion bash|zsh|fish   (source <(berth completion bash))"

// verbSpec is what completion knows of one verb.
type verbSpec struct {
	name  string
	subs  []string // first-argument words: "ls", "import", ...
	flags []string // "--template", "-i", ...
}

var (
	parenRe = lazyregexp.New(`\([^()]*\)`)
	flagRe  = lazyregexp.New(`(?:^|[\s\[|])(--?[a-z][a-z0-9-]*)`)
	subRe   = lazyregexp.New(`^[a-z][a-z-]*(\|[a-z][a-z-]*)*$`)
)

// specFor reads a verb's subcommands and flags off its usage line.
func specFor(c command) verbSpec {
	u := parenRe.ReplaceAllString(c.usage, "")
	v := verbSpec{name: c.name}
	seen := map[string]bool{}
	for _, alt := range strings.Split(u, " | ") {
		f := strings.Fields(alt)
		if len(f) > 0 && f[0] == c.name {
			f = f[1:]
		}
		if len(f) > 0 && subRe.MatchString(f[0]) {
			for _, s := range strings.Split(f[0], "|") {
				if !seen[s] {
					seen[s] = true
					v.subs = append(v.subs, s)
				}
			}
		}
	}
	for _, m := range flagRe.FindAllStringSubmatch(u, -1) {
		if fl := m[1]; !seen[fl] {
			seen[fl] = true
			v.flags = append(v.flags, fl)
		}
	}
	sort.Strings(v.flags)
	return v
}

func verbSpecs() []verbSpec {
	var out []verbSpec
	for _, c := range commands {
		out = append(out, specFor(c))
	}
	out = append(out, verbSpec{name: "help"}, verbSpec{name: "version"})
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func verbNames(specs []verbSpec) string {
	names := make([]string, 0, len(specs))
	for _, s := range specs {
		names = append(names, s.name)
	}
	return strings.Join(names, " ")
}

func runCompletion(e *env, args []string) error {
	if len(args) != 1 {
		return usageError{"completion: usage: berth " + completionUsage}
	}
	specs := verbSpecs()
	switch args[0] {
	case "bash":
		return bashCompletion(e.stdout, specs)
	case "zsh":
		return zshCompletion(e.stdout, specs)
	case "fish":
		return fishCompletion(e.stdout, specs)
	}
	return usageError{fmt.Sprintf("completion: unknown shell %q (want bash, zsh or fish)", args[0])}
}

func bashCompletion(w io.Writer, specs []verbSpec) error {
	var b strings.Builder
	b.WriteString(`# bash completion for berth: source <(berth completion bash)
_berth() {
	local cur=${COMP_WORDS[COMP_CWORD]} verb=${COMP_WORDS[1]} words=""
	COMPREPLY=()
	if [ "$COMP_CWORD" -eq 1 ]; then
		words="` + verbNames(specs) + `"
	else
		case "$verb" in
`)
	for _, s := range specs {
		switch {
		case s.name == "help":
			fmt.Fprintf(&b, "\t\thelp) [ \"$COMP_CWORD\" -eq 2 ] && words=%q ;;\n", verbNames(specs))
		case len(s.subs) > 0 || len(s.flags) > 0:
			fmt.Fprintf(&b, "\t\t%s)\n\t\t\tif [[ $cur == -* ]]; then words=%q\n", s.name, strings.Join(s.flags, " "))
			if len(s.subs) > 0 {
				fmt.Fprintf(&b, "\t\t\telif [ \"$COMP_CWORD\" -eq 2 ]; then words=%q\n", strings.Join(s.subs, " "))
			}
			b.WriteString("\t\t\tfi ;;\n")
		}
	}
	b.WriteString(`		esac
	fi
	if [ -n "$words" ]; then
		COMPREPLY=($(compgen -W "$words" -- "$cur"))
	fi
}
complete -o default -F _berth berth
`)
	_, err := io.WriteString(w, b.String())
	return err
}

func zshCompletion(w io.Writer, specs []verbSpec) error {
	var b strings.Builder
	b.WriteString(`#compdef berth
# zsh completion for berth: source <(berth completion zsh), or save it as _berth in $fpath
_berth() {
	local verb=${words[2]}
	if (( CURRENT == 2 )); then
		compadd -- ` + verbNames(specs) + `
		return
	fi
	case $verb in
`)
	for _, s := range specs {
		switch {
		case s.name == "help":
			fmt.Fprintf(&b, "\thelp) (( CURRENT == 3 )) && compadd -- %s ;;\n", verbNames(specs))
		case len(s.subs) > 0 || len(s.flags) > 0:
			fmt.Fprintf(&b, "\t%s)\n\t\tif [[ $PREFIX == -* ]]; then compadd -- %s\n", s.name, strings.Join(s.flags, " "))
			if len(s.subs) > 0 {
				fmt.Fprintf(&b, "\t\telif (( CURRENT == 3 )); then compadd -- %s\n", strings.Join(s.subs, " "))
			}
			b.WriteString("\t\telse _files; fi ;;\n")
		}
	}
	b.WriteString(`	*) _files ;;
	esac
}
if [ "$funcstack[1]" = "_berth" ]; then
	_berth "$@"
else
	compdef _berth berth
fi
`)
	_, err := io.WriteString(w, b.String())
	return err
}

func fishCompletion(w io.Writer, specs []verbSpec) error {
	var b strings.Builder
	b.WriteString("# fish completion for berth: berth completion fish | source\n")
	fmt.Fprintf(&b, "complete -c berth -n __fish_use_subcommand -f -a %q\n", verbNames(specs))
	for _, s := range specs {
		if s.name == "help" {
			fmt.Fprintf(&b, "complete -c berth -n '__fish_seen_subcommand_from help' -f -a %q\n", verbNames(specs))
			continue
		}
		if len(s.subs) > 0 {
			fmt.Fprintf(&b, "complete -c berth -n '__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s' -f -a %q\n",
				s.name, strings.Join(s.subs, " "), strings.Join(s.subs, " "))
		}
		for _, fl := range s.flags {
			opt := "-l " + strings.TrimPrefix(fl, "--")
			if !strings.HasPrefix(fl, "--") {
				opt = "-s " + strings.TrimPrefix(fl, "-")
			}
			fmt.Fprintf(&b, "complete -c berth -n '__fish_seen_subcommand_from %s' %s\n", s.name, opt)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
