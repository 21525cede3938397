// Package batchname checks the entry names of a batch of files (a tar
// streamed into a sandbox, or out of it): pure, so the CLI uses it without
// linking the agent client.
package batchname

import (
	"path"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Limits of one entry's name.
const (
	MaxPathBytes = 4096 // one entry's name
	MaxNameBytes = 255  // one component of it
)

// Check validates one entry name of a batch: relative, slash
// separated, no "..", ".", or empty component, no NUL, within the length
// limits. The error names the entry.
func Check(name string) error {
	n := strings.TrimSuffix(name, "/") // tar writers mark directories so
	switch {
	case n == "":
		return errs.Field("entry", "an entry has an empty name")
	case len(n) > MaxPathBytes:
		return errs.Field("entry", "%.64q...: name longer than %d bytes", n, MaxPathBytes)
	case strings.HasPrefix(n, "/"):
		return errs.Field("entry", "%q: absolute names are refused (names are relative to the target directory)", n)
	case strings.ContainsRune(n, 0):
		return errs.Field("entry", "%q: NUL in name", n)
	}
	for c := range strings.SplitSeq(n, "/") {
		switch {
		case c == "" || c == ".":
			return errs.Field("entry", "%q: empty or \".\" component (names must be clean)", n)
		case c == "..":
			return errs.Field("entry", "%q: \"..\" component refused", n)
		case len(c) > MaxNameBytes:
			return errs.Field("entry", "%q: a component is longer than %d bytes", n, MaxNameBytes)
		}
	}
	if path.Clean(n) != n {
		return errs.Field("entry", "%q: name is not clean", n)
	}
	return nil
}
