package cli

import "testing"

func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"api.github.com", "api.github.com"},
		{"bücher.example", "bücher.example"},
		{"evil\x1b]0;pwned\x07.test", `evil\x1b]0;pwned\x07.test`},
		{"\x1b[2J\x1b[Hclear", `\x1b[2J\x1b[Hclear`},
		{"a\tb\nc\rd", `a\x09b\x0ac\x0dd`},
		{"del\x7f", `del\x7f`},
		{"c1\u009b31m", `c1\u{9b}31m`},
		{"bidi\u202egnp.exe", `bidi\u{202e}gnp.exe`},
		{"bad\xffutf8", `bad\xffutf8`},
		{`back\x1bslash`, `back\\x1bslash`},
		{"", ""},
	} {
		if got := printable(tc.in); got != tc.want {
			t.Errorf("printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
