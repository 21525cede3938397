package template

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

// FuzzParseDockerfile: a tenant's Dockerfile parses into one stage that
// starts with FROM (after ARGs), with lines inside the file, or fails with
// an InvalidArgument error; expansion never panics.
func FuzzParseDockerfile(f *testing.F) {
	for _, s := range []string{
		"# comment\nARG BASE=tiny\nFROM $BASE\nRUN echo a \\\n  # inner comment\n  && echo b\nCOPY --chown=1000:1000 a b /dst/\nENV A=1 B=\"two words\"\nENV C legacy value\nCMD [\"sh\", \"-c\", \"x\"]\nEXPOSE 80\n",
		"FROM python:3.12-slim\r\nWORKDIR /app\r\nCOPY requirements.txt .\r\nRUN pip install -r requirements.txt\r\nUSER 1000\r\nENTRYPOINT [\"python\", \"app.py\"]\r\n",
		"FROM a\nRUN [\"sh\", \"-c\", \"echo ${A:-x} ${B:+y}\"]\nENV X=\"unterminated\n",
		"FROM a\nADD https://x/y /y\n", "FROM a\nFROM b\n", "RUN true\n", "FROM a\nRUN \\", "FROM a\nENV ${=}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		df, err := ParseDockerfile("Dockerfile", src)
		if err != nil {
			if errs.KindOf(err) != errs.InvalidArgument {
				t.Fatalf("error %v is not InvalidArgument", err)
			}
			return
		}
		lines := strings.Count(string(src), "\n") + 1
		seenFrom := false
		for _, st := range df.Steps {
			if st.Line < 1 || st.Line > lines {
				t.Fatalf("step %+v on line %d of %d", st, st.Line, lines)
			}
			if !seenFrom && st.Cmd != "FROM" && st.Cmd != "ARG" {
				t.Fatalf("%s before FROM accepted", st.Cmd)
			}
			seenFrom = seenFrom || st.Cmd == "FROM"
			_, _ = st.EnvPairs(map[string]string{"A": "x"})
			for _, a := range st.Args {
				_, _ = Expand(a, map[string]string{"A": "x"})
			}
		}
		if !seenFrom {
			t.Fatalf("a Dockerfile without FROM parsed")
		}
	})
}
