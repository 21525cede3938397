package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/merge"
)

// Merge routes (internal/merges, for targets whose tree only the agent can
// write: runsc keeps a sandbox's writes in the sentry):
//
//	POST /merge/stage  (body: one line of JSON merge.Journal, then a merge.WriteStage tar) -> 204
//	                   ?sync=host: the agent does not syncfs; the host syncs its upper
//	POST /merge/stop   MergeStopRequest   -> 200 MergeStopResult (every other process SIGSTOPped)
//	POST /merge/commit MergeJournal       -> 200 MergeCommitResult
//	POST /merge/finish MergeJournal       -> 204 (Recover beneath "/": rolls back a commit in progress, removes staging; SIGCONT)

// MergeStopRequest asks the agent to stop every other process and say
// which of them have one of Paths (relative to "/") open.
type MergeStopRequest struct {
	Paths []string `json:"paths"`
}

// MergeOpenFile is a process with a path of the merge open.
type MergeOpenFile struct {
	PID  int    `json:"pid"`
	Cmd  string `json:"cmd"`
	Path string `json:"path"`
}

// MergeStopResult is the answer of /merge/stop.
type MergeStopResult struct {
	Stopped   int             `json:"stopped"`
	OpenFiles []MergeOpenFile `json:"open_files,omitempty"`
}

// MergeJournal carries a merge's journal (the daemon keeps it).
type MergeJournal struct {
	Journal merge.Journal `json:"journal"`
}

// MergeCommitResult is the answer of /merge/commit: Error is empty on
// success; RolledBack says a failed commit was undone.
type MergeCommitResult struct {
	RolledBack bool   `json:"rolled_back"`
	Error      string `json:"error,omitempty"`
}

// MergeStage sends the journal and the staged objects (a merge.WriteStage
// tar), all in one streamed request. hostSync says the caller makes the
// staged files durable itself (a syncfs of the host's upper): the agent
// leaves out its own syncfs, which inside gVisor fsyncs file by file.
func (c *Client) MergeStage(ctx context.Context, j *merge.Journal, tar io.Reader, hostSync bool) error {
	b, err := json.Marshal(j)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "encode merge journal")
	}
	var q url.Values
	if hostSync {
		q = url.Values{"sync": {"host"}}
	}
	body := io.MultiReader(bytes.NewReader(append(b, '\n')), tar)
	resp, err := c.do(ctx, http.MethodPost, "/merge/stage", q, body, "application/octet-stream")
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBytes))
	return resp.Body.Close()
}

// MergeStop stops every other process of the sandbox.
func (c *Client) MergeStop(ctx context.Context, paths []string) (MergeStopResult, error) {
	var out MergeStopResult
	err := c.doJSON(ctx, http.MethodPost, "/merge/stop", MergeStopRequest{Paths: paths}, &out)
	return out, err
}

// MergeCommit runs the journal's renames in the sandbox.
func (c *Client) MergeCommit(ctx context.Context, j *merge.Journal) (MergeCommitResult, error) {
	var out MergeCommitResult
	err := c.doJSON(ctx, http.MethodPost, "/merge/commit", MergeJournal{Journal: *j}, &out)
	return out, err
}

// MergeFinish recovers or cleans up after a merge and resumes the stopped processes.
func (c *Client) MergeFinish(ctx context.Context, j *merge.Journal) error {
	return c.doJSON(ctx, http.MethodPost, "/merge/finish", MergeJournal{Journal: *j}, nil)
}
