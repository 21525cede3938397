package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Every verb answers -h, --help and `berth help VERB` with its usage on
// stdout and exit 0, without doing anything; a -h after "--" is the
// command's own.
func TestEveryVerbHasHelp(t *testing.T) {
	for _, c := range commands {
		for _, args := range [][]string{{c.name, "-h"}, {c.name, "--help"}, {"help", c.name}, {c.name, "x", "--help"}} {
			var out, errOut bytes.Buffer
			code := Main(context.Background(), args, strings.NewReader(""), &out, &errOut, nil)
			if code != ExitOK || !strings.HasPrefix(out.String(), "Usage: berth "+c.name) || errOut.Len() != 0 {
				t.Errorf("berth %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out.String(), errOut.String())
			}
		}
	}
	if wantsHelp([]string{"ID", "--", "ls", "-h"}) {
		t.Error("a -h after -- is the command's, not berth's")
	}
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"help", "nosuchverb"}, nil, &out, &errOut, nil); code != ExitUsage {
		t.Errorf("berth help nosuchverb: exit %d", code)
	}
}
