package template

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
)

func TestParseDockerfile(t *testing.T) {
	src := "# comment\nARG BASE=tiny\nFROM $BASE\nRUN echo a \\\n  # inner comment\n  && echo b\nCOPY --chown=1000:1000 a b /dst/\nENV A=1 B=\"two words\"\nENV C legacy value\nCMD [\"sh\", \"-c\", \"x\"]\nEXPOSE 80\n"
	df, err := ParseDockerfile("Dockerfile", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range df.Steps {
		got = append(got, s.Cmd+"@"+strconv.Itoa(s.Line)+":"+strings.Join(s.Args, "|"))
	}
	want := []string{"ARG@2:BASE=tiny", "FROM@3:$BASE", "RUN@4:echo|a|&&|echo|b", "COPY@7:a|b|/dst/",
		"ENV@8:A=1|B=two words", "ENV@9:C|legacy|value", "CMD@10:sh|-c|x"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("steps (-want +got):\n%s", d)
	}
	if df.Steps[3].Flags["chown"] != "1000:1000" {
		t.Errorf("flags %v", df.Steps[3].Flags)
	}
	pairs, _ := df.Steps[5].EnvPairs(nil)
	if d := cmp.Diff([][2]string{{"C", "legacy value"}}, pairs); d != "" {
		t.Errorf("legacy ENV: %s", d)
	}
}

func TestParseDockerfileErrors(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"FROM tiny\nRUN true\nFROBNICATE x\n", `Dockerfile:3: unknown instruction "FROBNICATE"`},
		{"RUN true\n", "Dockerfile:1: RUN before FROM"},
		{"FROM a\nFROM b\n", "Dockerfile:2: multi-stage"},
		{"FROM a\nADD https://x/y /y\n", "Dockerfile:2: ADD from a URL"},
		{"FROM a\nCOPY --from=b x y\n", "Dockerfile:2: COPY --from"},
		{"FROM a\nCOPY x\n", "Dockerfile:2: COPY needs"},
		{"FROM a\nENV\n", "Dockerfile:2: ENV needs arguments"},
		{"\n\n", "no FROM"},
	} {
		_, err := ParseDockerfile("Dockerfile", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) || errs.KindOf(err) != errs.InvalidArgument {
			t.Errorf("%q: got %v, want %q (invalid argument)", tc.src, err, tc.want)
		}
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "x", "EMPTY": ""}
	for in, want := range map[string]string{
		"$A/b": "x/b", "${A}b": "xb", "${EMPTY:-d}": "d", "${A:+alt}": "alt", "${NOPE:+alt}": "", `\$A`: "$A", "$": "$", "a$1": "a$1",
	} {
		got, err := Expand(in, vars)
		if err != nil || got != want {
			t.Errorf("Expand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
