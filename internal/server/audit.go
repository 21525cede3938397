package server

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/audit"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/store"
)

// auditAPI serves the audit chain (internal/audit, docs/AUDIT.md).
type auditAPI struct{ *Server }

// Bounds of GET /v1/audit.
const (
	auditDefaultLimit = 1000
	auditMaxLimit     = 10000
)

// auditActor is who a request's principal is in the chain.
func auditActor(p daemon.Principal) string {
	if p.Sandbox != "" {
		return "sandbox:" + p.Sandbox
	}
	return p.Owner
}

// audited runs an authenticated request's handler and appends one `api`
// entry: actor, method, route pattern, outcome status, sandbox. A
// non-admin's entry belongs to its own owner (a probe of another tenant's
// sandbox is the prober's entry, not the victim's); the admin's to the
// owner it acts for, or the sandbox's.
func (s *Server) audited(pattern string, h handler, w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	sw := &httpx.Recorder{ResponseWriter: w}
	if pattern == "POST /v1/sandboxes" {
		sw.Sniff = 512 // the new sandbox's id
	}
	err := h(sw, r, p)
	status := sw.Status
	if err != nil {
		status = httpx.Status(errs.KindOf(err))
	} else if status == 0 {
		status = http.StatusOK
	}
	id := r.PathValue("id")
	if p.Sandbox != "" {
		id = p.Sandbox
	}
	if id == "" && status < 300 {
		id = createdID(sw)
	}
	d := map[string]string{"method": r.Method, "route": pattern, "status": strconv.Itoa(status)}
	if err != nil {
		d["error"] = errs.KindOf(err).String()
	}
	own := p.Owner
	if p.Admin {
		d["admin"] = "true"
		own = owner(r, p) // "": the sandbox's owner, resolved by the chain's writer
	}
	s.d.Audit().Record(audit.Entry{Time: time.Now(), Actor: auditActor(p), Action: "api", SandboxID: id, Owner: own, Data: d})
	return err
}

var createdIDRe = lazyregexp.New(`"id":\s*"([a-z0-9]{1,64})"`)

// createdID is the id in the first bytes of a create's answer.
func createdID(w *httpx.Recorder) string {
	if m := createdIDRe.FindSubmatch(w.Head); m != nil {
		return string(m[1])
	}
	return ""
}

// listAudit: GET /v1/audit. An owner sees its own entries; the admin all
// (or one owner's); a sandbox principal only its own sandbox's.
func (s auditAPI) listAudit(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	f := store.AuditFilter{Owner: owner(r, p), SandboxID: q.Get("sandbox"), Limit: auditDefaultLimit}
	if p.Sandbox != "" {
		f.SandboxID = p.Sandbox
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errs.Field("after", "must be a sequence number, got %q", v)
		}
		f.AfterSeq = n
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return errs.Field("since", "must be an RFC 3339 time, got %q", v)
		}
		f.Since = t
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > auditMaxLimit {
			return errs.Field("limit", "must be between 1 and %d, got %q", auditMaxLimit, v)
		}
		f.Limit = n
	}
	rows, err := s.d.Audit().List(r.Context(), f)
	if err != nil {
		return err
	}
	out := wire.AuditList{Entries: make([]wire.AuditEntry, 0, len(rows))}
	for _, e := range rows {
		out.Entries = append(out.Entries, wire.AuditEntry{Seq: e.Seq, Time: e.Time, Actor: e.Actor, Action: e.Action,
			Sandbox: e.SandboxID, Owner: e.Owner, Data: e.Data, PrevHash: e.PrevHash, Hash: e.Hash})
	}
	if len(rows) == f.Limit {
		out.Next = rows[len(rows)-1].Seq
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// verifyAudit: POST /v1/audit/verify (admin). What was queued before the
// request is written first (bounded wait), so a verify right after an
// action covers it.
func (s auditAPI) verifyAudit(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	if err := adminOnly(p, "verify the audit chain"); err != nil {
		return err
	}
	ctx := r.Context()
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_ = s.d.Audit().Flush(fctx)
	cancel()
	rep, err := s.d.Audit().Verify(ctx)
	if err != nil {
		return err
	}
	out := wire.AuditReport{OK: rep.OK(), Entries: rep.Entries, LastSeq: rep.LastSeq, LastHash: rep.LastHash,
		HeadSeq: rep.HeadSeq, FileSeq: rep.FileSeq, Total: rep.Total}
	for _, pr := range rep.Problems {
		out.Problems = append(out.Problems, wire.AuditProblem{Seq: pr.Seq, Kind: pr.Kind, Message: pr.Message})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
