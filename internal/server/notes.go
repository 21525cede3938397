package server

import (
	"net/http"
	"strconv"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/notes"
)

// notesAPI serves handoff notes (internal/notes, docs/NOTES.md). Every
// route is reachable from inside the sandbox (selfRoutes): a sandbox
// principal reads and writes its own notes only.
type notesAPI struct{ s *Server }

// noteTarget is the sandbox a request's notes belong to: the path's, or
// for a request from inside a sandbox, that sandbox and no other.
func noteTarget(r *http.Request, p daemon.Principal) (string, error) {
	id := r.PathValue("id")
	if p.Sandbox != "" {
		if id != "self" && id != p.Sandbox {
			return "", errs.E(errs.NotFound, "sandbox %q not found", id)
		}
		return p.Sandbox, nil
	}
	return id, nil
}

func (a notesAPI) current(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id, err := noteTarget(r, p)
	if err != nil {
		return err
	}
	cur, err := a.s.d.Notes().Latest(r.Context(), owner(r, p), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, currentNoteView(cur))
	return nil
}

func (a notesAPI) write(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id, err := noteTarget(r, p)
	if err != nil {
		return err
	}
	var req wire.NoteRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	actor := p.Owner
	if p.Sandbox != "" {
		actor = "sandbox:" + p.Sandbox
	}
	n, err := a.s.d.Notes().Write(r.Context(), notes.WriteRequest{Owner: owner(r, p), Sandbox: id, Actor: actor,
		FromSandbox: p.Sandbox != "", Supplied: notes.Supplied{
			Reason: req.Reason, Unfinished: req.Unfinished, Next: req.Next, ContextVersion: req.ContextVersion}})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, noteView(*n))
	return nil
}

func (a notesAPI) list(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id, err := noteTarget(r, p)
	if err != nil {
		return err
	}
	list, err := a.s.d.Notes().List(r.Context(), owner(r, p), id)
	if err != nil {
		return err
	}
	out := wire.NoteList{Notes: make([]wire.Note, 0, len(list))}
	for _, n := range list {
		out.Notes = append(out.Notes, noteView(n))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a notesAPI) get(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id, err := noteTarget(r, p)
	if err != nil {
		return err
	}
	seq, err := strconv.ParseInt(r.PathValue("seq"), 10, 64)
	if err != nil || seq < 1 {
		return errs.Field("seq", "must be a note's sequence number (1, 2, ...), got %q", r.PathValue("seq"))
	}
	n, err := a.s.d.Notes().Get(r.Context(), owner(r, p), id, seq)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, noteView(*n))
	return nil
}

func currentNoteView(cur notes.Current) wire.CurrentNote {
	var out wire.CurrentNote
	if cur.Note != nil {
		v := noteView(*cur.Note)
		out.Note = &v
	}
	out.Desync = desyncView(cur.Desync)
	return out
}

func desyncView(d *notes.Desync) *wire.Desync {
	if d == nil {
		return nil
	}
	return &wire.Desync{AgentVersion: d.AgentVersion, MachineVersion: d.MachineVersion, Message: d.Message}
}

func noteRefView(r *notes.Ref) *wire.NoteRef {
	if r == nil {
		return nil
	}
	return &wire.NoteRef{SandboxID: r.Sandbox, Seq: r.Seq}
}

func noteView(n notes.Note) wire.Note {
	out := wire.Note{SandboxID: n.Sandbox, Seq: n.Seq, Trigger: n.Trigger, Actor: n.Actor, CreatedAt: n.CreatedAt,
		Reason: n.Reason, Unfinished: n.Unfinished, Next: n.Next, ContextVersion: n.ContextVersion, Collected: n.Collected,
		Files: wire.NoteFiles{Total: n.Files.Total, Added: n.Files.Added, Modified: n.Files.Modified, Deleted: n.Files.Deleted,
			SinceSeq: n.Files.SinceSeq, Truncated: n.Files.Truncated, Error: n.Files.Error},
		ReposTotal: n.ReposTotal, GitError: n.GitError, ProcessesError: n.ProcError,
		InheritedFrom: noteRefView(n.Inherited), RestoredFrom: noteRefView(n.Restored), Desync: desyncView(n.Desync),
		Warnings: n.Warnings, Millis: n.Millis}
	for _, c := range n.Files.Changes {
		out.Files.Changes = append(out.Files.Changes, wire.NoteFileChange{Path: c.Path, Kind: c.Kind, Type: c.Type, Size: c.Size, OldSize: c.OldSize})
	}
	for _, r := range n.Repos {
		out.Repos = append(out.Repos, wire.NoteRepo{Path: r.Path, Branch: r.Branch, Head: r.Head, Dirty: r.Dirty, DirtyTotal: r.DirtyTotal,
			Unpushed: r.Unpushed, UnpushedTotal: r.UnpushedTotal, Error: r.Error})
	}
	for _, pr := range n.Processes {
		out.Processes = append(out.Processes, wire.NoteProcess{Pid: pr.Pid, Tag: pr.Tag, Argv: pr.Argv, Cwd: pr.Cwd, User: pr.User, Start: pr.Start})
	}
	return out
}

// noteOf is the sandbox's current note for an answer that carries it
// (resume, rewind); a failure to read it never fails the answer.
func (s *Server) noteOf(r *http.Request, id string) (*wire.Note, *wire.Desync) {
	cur, err := s.d.Notes().Latest(r.Context(), "", id)
	if err != nil {
		s.log.Warn("read handoff note", "sandbox_id", id, "err", err)
		return nil, nil
	}
	v := currentNoteView(cur)
	return v.Note, v.Desync
}
