package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/activity"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
)

// activityAPI serves sandboxes' activity timelines (internal/activity).
type activityAPI struct{ *Server }

// activityQuery parses after, limit and kind (comma-separated).
func activityQuery(r *http.Request) (activity.Query, bool, error) {
	q := r.URL.Query()
	var out activity.Query
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return out, false, errs.Field("after", "must be a sequence number, got %q", v)
		}
		out.After = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return out, false, errs.Field("limit", "must be between 1 and %d, got %q", activity.MaxLimit, v)
		}
		out.Limit = n
	}
	for _, k := range q["kind"] {
		for _, part := range strings.Split(k, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out.Kinds = append(out.Kinds, part)
			}
		}
	}
	follow := false
	if v := q.Get("follow"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return out, false, errs.Field("follow", "must be true or false, got %q", v)
		}
		follow = b
	}
	return out, follow, out.Validate()
}

func (s activityAPI) sandboxActivity(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q, follow, err := activityQuery(r)
	if err != nil {
		return err
	}
	own, id := owner(r, p), r.PathValue("id")
	if !follow {
		list, err := s.d.Activity().List(r.Context(), own, id, q)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, list)
		return nil
	}
	// Follow: NDJSON, one entry per line, flushed per entry. Errors before
	// the first byte are ordinary error answers.
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	started := false
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
	}
	err = s.d.Activity().Follow(r.Context(), own, id, q, func(e wire.ActivityEntry) error {
		start()
		if err := enc.Encode(e); err != nil {
			return err
		}
		return rc.Flush()
	}, func() { start(); _ = rc.Flush() })
	if err != nil && !started {
		return err
	}
	return nil
}
