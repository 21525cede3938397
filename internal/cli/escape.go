package cli

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable makes s safe to print on a terminal: strings a sandbox chose
// (DNS names in `berth net log`, ...) may hold escape sequences that would
// rewrite the operator's screen or title, tabs and newlines that forge
// table rows, or bidi controls that reorder it. Control and other
// non-printing characters become \xNN or \u{N}, bytes that are not UTF-8
// \xNN, and a backslash \\ (so the escaping cannot be forged either).
// JSON output never goes through this: it stays exact.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || r == '\\' || !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r < 0x80 && !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\u{%x}`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
