// Package lazyregexp is a regular expression compiled on its first use.
//
// The berth binary is both the server and the CLI, and Go runs every
// linked package's initialisers before main: a package-level
// regexp.MustCompile in a server package is paid by every `berth ls`.
// Patterns with counted repetition are the expensive kind (`{0,62}`
// expands to 62 nested optional copies: ~700 allocations, ~0.1 ms each).
package lazyregexp

import (
	"regexp"
	"sync"
)

// Regexp is a *regexp.Regexp that compiles on first use. The pattern is a
// constant of the program: a bad one panics at its first use (as
// regexp.MustCompile would at start-up), which the tests of the package
// declaring it reach.
type Regexp struct {
	expr string
	re   func() *regexp.Regexp
}

// New returns expr, not yet compiled.
func New(expr string) *Regexp {
	return &Regexp{expr: expr, re: sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })}
}

// Regexp is the compiled expression (compiling it now if it is not yet).
func (r *Regexp) Regexp() *regexp.Regexp { return r.re() }

// String is the source text; it does not compile the expression.
func (r *Regexp) String() string { return r.expr }

func (r *Regexp) MatchString(s string) bool      { return r.re().MatchString(s) }
func (r *Regexp) Match(b []byte) bool            { return r.re().Match(b) }
func (r *Regexp) FindSubmatch(b []byte) [][]byte { return r.re().FindSubmatch(b) }
func (r *Regexp) FindStringSubmatch(s string) []string {
	return r.re().FindStringSubmatch(s)
}
func (r *Regexp) FindAllStringSubmatch(s string, n int) [][]string {
	return r.re().FindAllStringSubmatch(s, n)
}
func (r *Regexp) ReplaceAllString(src, repl string) string {
	return r.re().ReplaceAllString(src, repl)
}
