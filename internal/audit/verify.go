package audit

import (
	"context"
	"fmt"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Kinds of Problem.
const (
	ProblemChanged   = "changed"   // an entry does not match its hash or MAC
	ProblemRemoved   = "removed"   // seqs are missing in the middle of the chain
	ProblemReordered = "reordered" // an entry does not follow its predecessor (prev_hash)
	ProblemTruncated = "truncated" // entries after the last stored one are gone (a head records more)
	ProblemHead      = "head"      // a head is missing, fails its MAC, or names another entry
	ProblemRecorded  = "recorded"  // an audit.mismatch entry: a restart found the chain's end tampered
)

// MaxProblems bounds a report (the count of all is kept).
const MaxProblems = 100

// Problem is one finding of Verify; Seq is the entry it concerns.
type Problem struct {
	Seq     int64
	Kind    string
	Message string
}

// Report is what Verify found.
type Report struct {
	Entries  int64 // rows walked
	LastSeq  int64
	LastHash string
	HeadSeq  int64 // the store's head
	FileSeq  int64 // the head file's (0: none)
	Problems []Problem
	Total    int // problems found (Problems holds the first MaxProblems)
}

// OK reports a chain with no problem.
func (r Report) OK() bool { return r.Total == 0 }

func (r *Report) add(p Problem) {
	r.Total++
	if len(r.Problems) < MaxProblems {
		r.Problems = append(r.Problems, p)
	}
}

// heads are the chain's two heads, read before the rows they name.
type heads struct {
	db, file       store.AuditHead
	dbOK, fileOK   bool
	dbErr, fileErr error
	fileConfigured bool
}

// readHeads reads the head file, then the store's head: the file is
// written after the store's commit, so it never names a later entry than
// the store's head read after it (unless the store lost entries).
func (s *Service) readHeads(ctx context.Context) heads {
	var h heads
	if s.cfg.HeadPath != "" {
		h.fileConfigured = true
		h.file, h.fileOK, h.fileErr = readHead(s.cfg.HeadPath)
	}
	db, err := s.store.AuditHead(ctx)
	switch {
	case err == nil:
		h.db, h.dbOK = db, true
	case !errs.Is(err, errs.NotFound):
		h.dbErr = err
	}
	return h
}

// checkHeads compares the end of the stored chain (c, as far as the walk
// went) with both heads.
func (s *Service) checkHeads(ctx context.Context, h heads, c chain) []Problem {
	var out []Problem
	bad := func(seq int64, kind, format string, args ...any) {
		out = append(out, Problem{Seq: seq, Kind: kind, Message: fmt.Sprintf(format, args...)})
	}
	switch {
	case h.dbErr != nil:
		bad(c.seq, ProblemHead, "the store's head cannot be read: %v", h.dbErr)
	case !h.dbOK:
		if c.seq > 0 {
			bad(c.seq, ProblemHead, "the store holds entries up to seq %d but no head", c.seq)
		}
	case !macOK(s.cfg.Key, h.db.Seq, h.db.Hash, h.db.MAC):
		bad(h.db.Seq, ProblemHead, "the store's head (seq %d) fails its MAC: it was edited", h.db.Seq)
	case h.db.Seq > c.seq:
		bad(c.seq+1, ProblemTruncated, "the store's head is seq %d but the chain ends at seq %d: entries %d-%d were removed",
			h.db.Seq, c.seq, c.seq+1, h.db.Seq)
	case h.db.Seq != c.seq || h.db.Hash != c.hash:
		bad(h.db.Seq, ProblemHead, "the store's head (seq %d) is not the chain's last entry (seq %d)", h.db.Seq, c.seq)
	}
	if !h.fileConfigured {
		return out
	}
	switch {
	case h.fileErr != nil:
		bad(c.seq, ProblemHead, "the head file cannot be read: %v", h.fileErr)
	case !h.fileOK:
		if c.seq > 0 {
			bad(c.seq, ProblemHead, "the head file is missing while the chain has %d entries", c.seq)
		}
	case !macOK(s.cfg.Key, h.file.Seq, h.file.Hash, h.file.MAC):
		bad(h.file.Seq, ProblemHead, "the head file (seq %d) fails its MAC: it was edited", h.file.Seq)
	case h.file.Seq > c.seq:
		bad(c.seq+1, ProblemTruncated, "the head file records seq %d but the chain ends at seq %d: entries %d-%d were removed",
			h.file.Seq, c.seq, c.seq+1, h.file.Seq)
	default:
		// The file may lag the store by the batch a crash interrupted;
		// the entry it names must still be the one stored.
		hash := c.hash
		if h.file.Seq < c.seq {
			rows, err := s.store.ListAudit(ctx, store.AuditFilter{AfterSeq: h.file.Seq - 1, Limit: 1})
			if err != nil || len(rows) == 0 || rows[0].Seq != h.file.Seq {
				bad(h.file.Seq, ProblemRemoved, "the entry the head file names (seq %d) is missing", h.file.Seq)
				return out
			}
			hash = rows[0].Hash
		}
		if hash != h.file.Hash {
			bad(h.file.Seq, ProblemChanged, "seq %d differs from the one the head file records", h.file.Seq)
		}
	}
	return out
}

// page is how many rows Verify reads at a time.
const page = 2000

// Verify walks the whole chain and checks every link and every MAC, and
// the chain's end against both heads (read first).
func (s *Service) Verify(ctx context.Context) (Report, error) {
	h := s.readHeads(ctx)
	var r Report
	r.HeadSeq = h.db.Seq
	if h.fileOK {
		r.FileSeq = h.file.Seq
	}
	end := int64(-1) // walk every row when the store's head is missing or forged
	if h.dbOK && macOK(s.cfg.Key, h.db.Seq, h.db.Hash, h.db.MAC) {
		end = h.db.Seq
	}
	// Rows after the head were written while Verify ran: they are checked
	// like the others, and the heads are compared with the chain as it was
	// at the head's seq.
	c, atHead := chain{hash: Genesis}, chain{hash: Genesis}
	expect := int64(1)
	for {
		rows, err := s.store.ListAudit(ctx, store.AuditFilter{AfterSeq: c.seq, Limit: page})
		if err != nil {
			return Report{}, err
		}
		for _, e := range rows {
			s.check(&r, e, c, expect)
			r.Entries++
			c = chain{seq: e.Seq, hash: e.Hash}
			if end < 0 || e.Seq <= end {
				atHead = c
			}
			expect = e.Seq + 1
		}
		if len(rows) < page || ctx.Err() != nil {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	r.LastSeq, r.LastHash = c.seq, c.hash
	for _, p := range s.checkHeads(ctx, h, atHead) {
		r.add(p)
	}
	return r, nil
}

// check is one entry's tests: its place, its data, its hash and MAC, and
// its link to the entry before it. One problem per entry (the first).
func (s *Service) check(r *Report, e store.AuditEntry, prev chain, expect int64) {
	gap := e.Seq != expect
	if gap {
		r.add(Problem{Seq: expect, Kind: ProblemRemoved, Message: removed(expect, e.Seq-1)})
	}
	switch {
	case e.Data == nil:
		r.add(Problem{Seq: e.Seq, Kind: ProblemChanged, Message: fmt.Sprintf("seq %d: its data is not a JSON object of strings (edited)", e.Seq)})
	case Hash(e.PrevHash, e) != e.Hash:
		r.add(Problem{Seq: e.Seq, Kind: ProblemChanged, Message: fmt.Sprintf("seq %d (%s): the entry does not match its hash: a field was changed, or the entry was moved", e.Seq, e.Action)})
	case !macOK(s.cfg.Key, e.Seq, e.Hash, e.MAC):
		r.add(Problem{Seq: e.Seq, Kind: ProblemChanged, Message: fmt.Sprintf("seq %d (%s): its MAC fails: the entry was rewritten without the audit key", e.Seq, e.Action)})
	case !gap && e.PrevHash != prev.hash:
		r.add(Problem{Seq: e.Seq, Kind: ProblemReordered, Message: fmt.Sprintf("seq %d does not follow seq %d (its prev_hash differs): entries were reordered or replaced", e.Seq, prev.seq)})
	case e.Action == ActionMismatch:
		r.add(Problem{Seq: e.Seq, Kind: ProblemRecorded, Message: fmt.Sprintf("seq %d: at a restart the chain's end disagreed with its heads (%s)", e.Seq, e.Data["problem_1"])})
	}
}

func removed(from, to int64) string {
	if from == to {
		return fmt.Sprintf("seq %d is missing: the entry was removed", from)
	}
	return fmt.Sprintf("seqs %d-%d are missing: the entries were removed", from, to)
}
