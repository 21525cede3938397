package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/berth-dev/berth/api/gen/process"
	"github.com/berth-dev/berth/api/gen/process/processconnect"
	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/testutil"
)

// activityOf reads a sandbox's whole timeline through the REST API with key
// (status and entries).
func (s *server) activityOf(key, id, query string) (int, []wire.ActivityEntry) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.url+"/v1/sandboxes/"+id+"/activity?limit=10000&"+query, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var list wire.ActivityList
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &list); err != nil {
			s.t.Fatalf("activity answer: %v: %s", err, b)
		}
	}
	return resp.StatusCode, list.Entries
}

// findEntry returns the index of the first entry after from that matches.
func findEntry(es []wire.ActivityEntry, from int, match func(wire.ActivityEntry) bool) int {
	for i := from; i < len(es); i++ {
		if match(es[i]) {
			return i
		}
	}
	return -1
}

func isExec(argv ...string) func(wire.ActivityEntry) bool {
	return func(e wire.ActivityEntry) bool { return e.Kind == wire.ActivityExec && slices.Equal(e.Data.Argv, argv) }
}

// followActivity runs `berth activity ID --follow --json` and delivers its
// entries; the returned func waits for its exit (and kills it after wait).
func (s *server) followActivity(t *testing.T, key, id string) (<-chan wire.ActivityEntry, func(wait time.Duration) error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, "berth"), "activity", id, "--follow", "--json")
	cmd.Env = s.env(key)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan wire.ActivityEntry, 1024)
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e wire.ActivityEntry
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Errorf("follow line %q: %v", sc.Text(), err)
				continue
			}
			ch <- e
		}
		close(ch)
		done <- cmd.Wait()
	}()
	var once sync.Once
	finish := func(wait time.Duration) error {
		var err error
		once.Do(func() {
			select {
			case err = <-done:
			case <-time.After(wait):
				_ = cmd.Process.Kill()
				<-done
				err = fmt.Errorf("berth activity --follow still running after %v", wait)
			}
		})
		return err
	}
	t.Cleanup(func() { _ = finish(0) })
	return ch, finish
}

// TestActivityTimeline: on runc and runsc, three execs (exit 0, exit 3,
// killed by a signal) and one with stdin, files written through the API
// and inside the sandbox as root, a denied egress attempt and a
// pause/resume all appear in `berth activity`, in order, with their
// fields; --follow sees a new exec at once and ends when the sandbox is
// deleted; another owner gets NotFound; the timeline survives a restart.
func TestActivityTimeline(t *testing.T) {
	inet := newInternet(t)
	s := startServer(t, inet.serveArgs()...)
	mallory := strings.TrimSpace(s.must("key", "create", "--owner", "mallory"))
	kept := s.create()
	s.must("exec", kept, "--", "echo", "before the restart")

	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			id := s.create("--runtime", rt)
			s.must("exec", id, "--", "echo", "hello")
			if out, code := s.run("exec", id, "--", "sh", "-c", "exit 3"); code != 3 {
				t.Fatalf("exit 3: exit %d: %s", code, out)
			}
			if out, code := s.run("exec", id, "--", "sh", "-c", "kill -9 $$"); code == 0 {
				t.Fatalf("kill -9 $$: exit 0: %s", out)
			}
			if out, code := s.runAs(s.key, strings.NewReader("abc"), "exec", "-i", id, "--", "cat"); code != 0 || out != "abc" {
				t.Fatalf("exec -i cat: exit %d: %q", code, out)
			}
			if out, code := s.runAs(s.key, strings.NewReader("through the api"), "cp", "-", id+":/tmp/api.txt"); code != 0 {
				t.Fatalf("cp: exit %d: %s", code, out)
			}
			if code, body := s.api(s.key, http.MethodPost, "/v1/sandboxes/"+id+"/fs/mkdir", map[string]string{"path": "/tmp/apidir"}); code != http.StatusOK {
				t.Fatalf("fs/mkdir: %d %v", code, body)
			}
			// Inside, as root: the sampler sees it in the workspace.
			s.must("exec", "--user", "root", id, "--", "sh", "-c", "echo written-inside > /root/inside.txt")
			if out, ok := s.fetch(id, "http://good.test/"); ok {
				t.Fatalf("deny-all sandbox fetched good.test: %s", out)
			}
			// The proxy's log is written in batches: its entry (with the
			// time of the decision) joins the timeline when it is flushed.
			testutil.Eventually(t, testutil.Within(15*time.Second), func() error {
				if _, es := s.activityOf(s.key, id, "kind=egress"); len(es) == 0 {
					return fmt.Errorf("no egress entry yet")
				}
				return nil
			})
			s.must("pause", id, "--mode", "freeze")
			s.must("resume", id)

			var es []wire.ActivityEntry
			testutil.Eventually(t, testutil.Within(30*time.Second).Every(250*time.Millisecond), func() error {
				_, es = s.activityOf(s.key, id, "")
				for what, match := range map[string]func(wire.ActivityEntry) bool{
					"workspace sample": func(e wire.ActivityEntry) bool {
						return e.Kind == wire.ActivityFile && e.Data.Source == "workspace" && e.Data.Path == "/root/inside.txt"
					},
					"egress denial": func(e wire.ActivityEntry) bool { return e.Kind == wire.ActivityEgress && e.Data.Verdict == "deny" },
					"resume":        func(e wire.ActivityEntry) bool { return e.Kind == wire.ActivityResume },
				} {
					if findEntry(es, 0, match) < 0 {
						return fmt.Errorf("no %s yet in %d entries", what, len(es))
					}
				}
				return nil
			})
			for i := 1; i < len(es); i++ {
				if es[i].Seq <= es[i-1].Seq {
					t.Fatalf("entries out of seq order at %d: %d after %d", i, es[i].Seq, es[i-1].Seq)
				}
			}
			if e := es[0]; e.Kind != wire.ActivityLifecycle || e.Data.ToState != wire.StateRunning {
				t.Errorf("first entry = %+v, want the transition to running", e)
			}

			// The execs, in order, with their fields.
			iHello := findEntry(es, 0, isExec("echo", "hello"))
			iExit3 := findEntry(es, iHello+1, isExec("sh", "-c", "exit 3"))
			iKill := findEntry(es, iExit3+1, isExec("sh", "-c", "kill -9 $$"))
			iCat := findEntry(es, iKill+1, isExec("cat"))
			if iHello < 0 || iExit3 < 0 || iKill < 0 || iCat < 0 {
				t.Fatalf("execs not all there in order (%d %d %d %d):\n%s", iHello, iExit3, iKill, iCat, dumpActivity(es))
			}
			hello, exit3, kill, cat := es[iHello].Data, es[iExit3].Data, es[iKill].Data, es[iCat].Data
			if hello.ExitCode == nil || *hello.ExitCode != 0 || hello.BytesOut != int64(len("hello\n")) || hello.Pid <= 0 ||
				hello.Started.IsZero() || hello.Ended.Before(hello.Started) {
				t.Errorf("echo hello: %+v", hello)
			}
			if exit3.ExitCode == nil || *exit3.ExitCode != 3 || !strings.Contains(es[iExit3].Summary, "exit 3") {
				t.Errorf("exit 3: %+v (%q)", exit3, es[iExit3].Summary)
			}
			if kill.ExitCode != nil || kill.Signal != "killed" {
				t.Errorf("kill -9: %+v, want signal killed and no exit code", kill)
			}
			if cat.BytesIn != 3 || cat.BytesOut != 3 {
				t.Errorf("cat with stdin: bytes in %d out %d, want 3 and 3", cat.BytesIn, cat.BytesOut)
			}
			if i := findEntry(es, 0, func(e wire.ActivityEntry) bool {
				return e.Kind == wire.ActivityExec && e.Data.User == "root" && len(e.Data.Argv) == 3 && strings.Contains(e.Data.Argv[2], "inside.txt")
			}); i < 0 {
				t.Errorf("no exec as root writing inside.txt:\n%s", dumpActivity(es))
			}

			// Files through the API and in the workspace.
			iCp := findEntry(es, iCat+1, func(e wire.ActivityEntry) bool {
				return e.Kind == wire.ActivityFile && e.Data.Source == "api" && e.Data.Op == "write" && e.Data.Path == "/tmp/api.txt"
			})
			iMkdir := findEntry(es, iCp+1, func(e wire.ActivityEntry) bool {
				return e.Kind == wire.ActivityFile && e.Data.Op == "mkdir" && e.Data.Path == "/tmp/apidir"
			})
			if iCp < 0 || iMkdir < 0 || es[iCp].Data.Size != int64(len("through the api")) {
				t.Errorf("API file entries (%d, %d):\n%s", iCp, iMkdir, dumpActivity(es))
			}
			iInside := findEntry(es, 0, func(e wire.ActivityEntry) bool {
				return e.Kind == wire.ActivityFile && e.Data.Source == "workspace" && e.Data.Path == "/root/inside.txt"
			})
			if d := es[iInside].Data; d.Size != int64(len("written-inside\n")) || es[iInside].Actor != "sandbox" {
				t.Errorf("workspace sample: %+v (actor %s)", d, es[iInside].Actor)
			}

			// The egress denial, then the pause and the resume with their modes.
			iDeny := findEntry(es, iMkdir+1, func(e wire.ActivityEntry) bool { return e.Kind == wire.ActivityEgress && e.Data.Verdict == "deny" })
			iPause := findEntry(es, iDeny+1, func(e wire.ActivityEntry) bool { return e.Kind == wire.ActivityPause })
			iResume := findEntry(es, iPause+1, func(e wire.ActivityEntry) bool { return e.Kind == wire.ActivityResume })
			if iDeny < 0 || iPause < 0 || iResume < 0 {
				t.Fatalf("egress, pause, resume not in order (%d %d %d):\n%s", iDeny, iPause, iResume, dumpActivity(es))
			}
			if d := es[iDeny].Data; d.Proto == "" || (d.Host == "" && d.DstIP == "") {
				t.Errorf("egress entry: %+v", d)
			}
			if d := es[iPause].Data; d.Mode != "freeze" || d.Requested != "freeze" {
				t.Errorf("pause entry: %+v, want mode freeze", d)
			}
			if d := es[iResume].Data; d.ResumedFrom != "freeze" {
				t.Errorf("resume entry: %+v, want resumed from freeze", d)
			}

			// The human form: one line per entry, with time, kind, summary.
			human := s.must("activity", id)
			if lines := strings.Split(human, "\n"); len(lines) != len(es) {
				t.Errorf("berth activity: %d lines for %d entries:\n%s", len(lines), len(es), human)
			}
			if !strings.Contains(human, "exec      $ sh -c exit 3 → exit 3") || !strings.Contains(human, "pause     paused (freeze)") {
				t.Errorf("berth activity:\n%s", human)
			}
			var kinds wire.ActivityList
			if err := json.Unmarshal([]byte(s.must("activity", id, "--json", "--kind", "pause,resume")), &kinds); err != nil {
				t.Fatal(err)
			}
			if len(kinds.Entries) != 2 || kinds.Entries[0].Kind != wire.ActivityPause || kinds.Next != kinds.Entries[1].Seq {
				t.Errorf("--kind pause,resume: %+v", kinds)
			}

			// Another owner: NotFound on every path (REST, CLI, follow).
			if code, _ := s.activityOf(mallory, id, ""); code != http.StatusNotFound {
				t.Errorf("another owner's GET activity: %d, want 404", code)
			}
			if code, _ := s.activityOf(mallory, id, "follow=true"); code != http.StatusNotFound {
				t.Errorf("another owner's follow: %d, want 404", code)
			}
			if out, code := s.runAs(mallory, nil, "activity", id); code != 3 {
				t.Errorf("berth activity as another owner: exit %d: %s", code, out)
			}

			// --follow: the backlog, then a new exec within a second; the
			// stream ends when the sandbox is deleted.
			entries, finish := s.followActivity(t, s.key, id)
			for n := 0; n < len(es); n++ {
				select {
				case <-entries:
				case <-time.After(10 * time.Second):
					t.Fatalf("follow: only %d of %d backlog entries", n, len(es))
				}
			}
			s.must("exec", id, "--", "echo", "follow-me")
			returned := time.Now()
			deadline := time.After(time.Second)
		wait:
			for {
				select {
				case e := <-entries:
					if isExec("echo", "follow-me")(e) {
						t.Logf("%s: --follow printed the new exec %v after the exec returned", rt, time.Since(returned).Round(time.Millisecond))
						break wait
					}
				case <-deadline:
					t.Fatal("--follow did not show the new exec within a second")
				}
			}
			s.must("rm", "-f", id)
			if err := finish(10 * time.Second); err != nil {
				t.Errorf("follow after deletion: %v", err)
			}
			if code, _ := s.activityOf(s.key, id, ""); code != http.StatusNotFound {
				t.Errorf("activity of a deleted sandbox: %d, want 404", code)
			}
		})
	}

	// The timeline is in the store: a restarted daemon answers the same.
	_, before := s.activityOf(s.key, kept, "")
	s.stop()
	s.start()
	_, after := s.activityOf(s.key, kept, "")
	if findEntry(before, 0, isExec("echo", "before the restart")) < 0 || len(after) < len(before) {
		t.Fatalf("before the restart %d entries, after %d:\n%s", len(before), len(after), dumpActivity(after))
	}
	for i := range before {
		if before[i].Seq != after[i].Seq || before[i].Summary != after[i].Summary {
			t.Errorf("entry %d changed across the restart: %+v → %+v", i, before[i], after[i])
		}
	}
}

// TestActivityBoundedUnderSpam: root in a sandbox spamming workspace writes
// and denied connections, while its owner spams execs, cannot grow its
// timeline past --activity-retention nor evict another sandbox's entries,
// and the daemon keeps answering (latencies logged, not asserted).
func TestActivityBoundedUnderSpam(t *testing.T) {
	const retention = 300
	inet := newInternet(t)
	s := startServer(t, append(inet.serveArgs(), "--activity-retention", fmt.Sprint(retention))...)
	for _, rt := range runtimesOf(t, s) {
		t.Run(rt, func(t *testing.T) {
			quiet := s.create("--runtime", rt)
			s.must("exec", quiet, "--", "echo", "quiet")
			_, quietBefore := s.activityOf(s.key, quiet, "")
			spam := s.create("--runtime", rt)
			base := execLatency(t, s, spam, 5)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			// Root inside: thousands of file writes and denied connections.
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.run("exec", "--user", "root", spam, "--", "sh", "-c",
					`i=0; while [ $i -lt 4000 ]; do echo $i > /root/spam$((i % 700)); i=$((i+1)); done &
					 j=0; while [ $j -lt 300 ]; do timeout 2 wget -q -T 1 -O /dev/null http://`+inet.prefix+`.10/ 2>/dev/null; j=$((j+1)); done; wait`)
			}()
			// The owner: execs from 8 clients at once.
			var execs sync.WaitGroup
			var nExec int
			var mu sync.Mutex
			for range 8 {
				execs.Add(1)
				go func() {
					defer execs.Done()
					for ctx.Err() == nil {
						c := exec.CommandContext(ctx, filepath.Join(s.bin, "berth"), "exec", spam, "--", "true")
						c.Env = s.env(s.key)
						if c.Run() == nil {
							mu.Lock()
							nExec++
							mu.Unlock()
						}
					}
				}()
			}
			// Meanwhile: how long a plain API read takes, and the timeline's size.
			var reads []time.Duration
			maxSeen := 0
			end := time.Now().Add(20 * time.Second)
			for time.Now().Before(end) {
				t0 := time.Now()
				code, es := s.activityOf(s.key, spam, "")
				reads = append(reads, time.Since(t0))
				if code != http.StatusOK {
					t.Fatalf("activity during spam: %d", code)
				}
				maxSeen = max(maxSeen, len(es))
				time.Sleep(200 * time.Millisecond)
			}
			during := execLatency(t, s, spam, 5)
			cancel()
			execs.Wait()
			wg.Wait()

			var es []wire.ActivityEntry
			testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
				if _, es = s.activityOf(s.key, spam, ""); len(es) != retention {
					return fmt.Errorf("spammed sandbox keeps %d entries, want exactly %d", len(es), retention)
				}
				return nil
			})
			kinds := map[string]int{}
			for _, e := range es {
				kinds[e.Kind]++
			}
			_, quietAfter := s.activityOf(s.key, quiet, "")
			if len(quietAfter) < len(quietBefore) || quietAfter[0].Seq != quietBefore[0].Seq {
				t.Errorf("the quiet sandbox lost entries: %d before, %d after", len(quietBefore), len(quietAfter))
			}
			sort.Slice(reads, func(i, j int) bool { return reads[i] < reads[j] })
			t.Logf("%s: %d execs in 20 s from 8 clients + root writing 4000 files and 300 denied connections: "+
				"timeline max %d (bound %d, + a tenth and one 250 ms sweep of arrivals while busy), after %d %v; "+
				"GET activity p50 %v max %v; exec true p50 %v before, %v during",
				rt, nExec, maxSeen, retention, len(es), kinds, reads[len(reads)/2].Round(time.Millisecond),
				reads[len(reads)-1].Round(time.Millisecond), base.Round(time.Millisecond), during.Round(time.Millisecond))
			if maxSeen > 4*retention {
				t.Errorf("the timeline grew to %d entries under spam (bound %d)", maxSeen, retention)
			}
		})
	}
}

// execLatency is the median wall time of n `berth exec ID -- true`.
func execLatency(t *testing.T, s *server, id string, n int) time.Duration {
	t.Helper()
	var ds []time.Duration
	for range n {
		t0 := time.Now()
		s.must("exec", id, "--", "true")
		ds = append(ds, time.Since(t0))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[n/2]
}

func dumpActivity(es []wire.ActivityEntry) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "%d %s %s %s\n", e.Seq, e.Kind, e.Actor, e.Summary)
	}
	return b.String()
}

// TestActivityE2B: the E2B surface (envd process start over Connect, envd
// file upload) lands in the same timeline as REST: the agent client is
// where both meet.
func TestActivityE2B(t *testing.T) {
	s := startServer(t)
	c, body := s.e2b("POST", "/sandboxes", map[string]any{"templateID": "tiny"})
	if c != http.StatusCreated {
		t.Fatalf("e2b create: %d %v", c, body)
	}
	id, _ := body["sandboxID"].(string)
	token, _ := body["envdAccessToken"].(string)
	headers := func(h http.Header) {
		h.Set("E2b-Sandbox-Id", id)
		h.Set("E2b-Sandbox-Port", "49983")
		h.Set("X-Access-Token", token)
	}
	proc := processconnect.NewProcessClient(http.DefaultClient, s.url, connect.WithProtoJSON())
	no := false
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo e2b; exit 5"}}, Stdin: &no})
	headers(req.Header())
	stream, err := proc.Start(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("process start stream: %v", err)
	}
	stream.Close()

	up, _ := http.NewRequest(http.MethodPost, s.url+"/files?path=/tmp/e2b.txt", strings.NewReader("via envd"))
	headers(up.Header)
	up.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(up)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("envd upload: %d", resp.StatusCode)
	}

	var es []wire.ActivityEntry
	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
		_, es = s.activityOf(s.key, id, "kind=exec,file")
		if len(es) < 2 {
			return fmt.Errorf("%d entries:\n%s", len(es), dumpActivity(es))
		}
		return nil
	})
	i := findEntry(es, 0, isExec("/bin/sh", "-c", "echo e2b; exit 5"))
	if i < 0 || es[i].Data.ExitCode == nil || *es[i].Data.ExitCode != 5 || es[i].Data.BytesOut != int64(len("e2b\n")) {
		t.Errorf("E2B process start: %+v in\n%s", es, dumpActivity(es))
	}
	if j := findEntry(es, i+1, func(e wire.ActivityEntry) bool {
		return e.Kind == wire.ActivityFile && e.Data.Path == "/tmp/e2b.txt" && e.Data.Size == int64(len("via envd")) && e.Data.Source == "api"
	}); j < 0 {
		t.Errorf("envd upload not in the timeline:\n%s", dumpActivity(es))
	}
}

// TestActivityReaper: a reaper decision is in the timeline with its
// signals, before the pause it led to; and following a sandbox's timeline
// is not using it: a followed idle sandbox is reaped like any other.
func TestActivityReaper(t *testing.T) {
	s := startReaperServer(t)
	id := s.create()
	entries, _ := s.followActivity(t, s.key, id)
	go func() {
		for range entries {
		}
	}()
	var es []wire.ActivityEntry
	testutil.Eventually(t, testutil.Within(30*time.Second).Every(250*time.Millisecond), func() error {
		_, es = s.activityOf(s.key, id, "kind=reaper,pause")
		if findEntry(es, 0, func(e wire.ActivityEntry) bool { return e.Kind == wire.ActivityPause }) < 0 {
			return fmt.Errorf("the followed idle sandbox was not paused by the reaper:\n%s", dumpActivity(es))
		}
		return nil
	})
	i := findEntry(es, 0, func(e wire.ActivityEntry) bool { return e.Kind == wire.ActivityReaper })
	if i < 0 {
		t.Fatalf("no reaper entry:\n%s", dumpActivity(es))
	}
	r := es[i]
	if r.Actor != "reaper" || r.Data.Attrs["action"] != "pause" || r.Data.Attrs["policy"] != "fast" || r.Data.Reason == "" ||
		len(r.Data.Attrs) < 4 || !strings.Contains(r.Summary, "reaper: pause") {
		t.Errorf("reaper entry = %+v, want the action, policy and signals", r)
	}
	if j := findEntry(es, i+1, func(e wire.ActivityEntry) bool { return e.Kind == wire.ActivityPause && e.Data.Mode == "freeze" }); j < 0 {
		t.Errorf("no freeze pause after the reaper's decision:\n%s", dumpActivity(es))
	}
}
