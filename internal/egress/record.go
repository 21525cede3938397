package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// EffectHeader is the response header telling the sandbox which ledger
// entry a side effect got ("<id>" when sent, "<id>; replayed" when answered
// from the ledger).
const EffectHeader = "Berth-Effect"

// maxReplayHeader bounds the response head kept for replay.
const maxReplayHeader = 16 << 10

// recordable reports whether one request is a side effect the ledger
// records: every request carrying an injected secret, and a non-safe
// method to an effectful host.
func recordable(pol EffectPolicy, host string, port uint16, method string, secret bool) bool {
	return secret || (!SafeMethod(method) && pol.Effectful(host, port))
}

// relayEffect sends one recordable request through the ledger: the body
// is read (bounded) and hashed, the intent recorded, and only then the
// request is sent to up; the outcome is handed to the ledger once the
// answer has been relayed — Finish does not wait for its commit, so
// neither the answer's last byte nor the next request on the connection
// waits for the store (a repeat arriving meanwhile waits for it in the
// ledger). A repeat the ledger answers is never sent. ready waits until
// up can be written (the upstream's handshake may still be running while
// the intent commits); if it cannot, the effect is withdrawn: nothing was
// sent. end says the connection must close.
func (p *Proxy) relayEffect(ctx context.Context, led Ledger, in Intent, req *http.Request, client io.Writer, up io.Writer, ubr *bufio.Reader,
	ready func() error) (end bool, err error) {
	if req.ContentLength > MaxEffectBody {
		writeStatus(client, http.StatusRequestEntityTooLarge, "berth egress: a side effect's body is limited to "+strconv.Itoa(MaxEffectBody)+" bytes (the ledger hashes it before sending); not sent")
		return true, nil
	}
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		// The ledger needs the whole body before anything goes upstream.
		if _, err := io.WriteString(client, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return true, err
		}
		req.Header.Del("Expect")
	}
	// No Close on the way out: it would drain the rest of a hostile body.
	body, err := io.ReadAll(io.LimitReader(req.Body, MaxEffectBody+1))
	if err != nil {
		return true, err
	}
	if len(body) > MaxEffectBody {
		writeStatus(client, http.StatusRequestEntityTooLarge, "berth egress: a side effect's body is limited to "+strconv.Itoa(MaxEffectBody)+" bytes (the ledger hashes it before sending); not sent")
		return true, nil
	}
	key := req.Header.Get("Idempotency-Key")
	if len(key) > MaxIdempotencyKey || strings.ContainsAny(key, "\r\n\x00") {
		writeStatus(client, http.StatusBadRequest, "berth egress: Idempotency-Key must be at most "+strconv.Itoa(MaxIdempotencyKey)+" bytes; not sent")
		return true, nil
	}
	sum := sha256.Sum256(body)
	in.Method, in.Path, in.Key = req.Method, req.URL.RequestURI(), key
	in.BodySHA256, in.BodySize = hex.EncodeToString(sum[:]), int64(len(body))
	t, err := led.Begin(ctx, in)
	if err != nil {
		p.log.Warn("egress: side-effect ledger refused an intent", "sandbox_id", in.SandboxID, "host", in.Host, "err", err)
		writeStatus(client, http.StatusServiceUnavailable, "berth egress: the side-effect ledger could not record this request, so it was not sent")
		return true, nil
	}
	switch {
	case t.Replay != nil:
		return false, writeReplay(client, req, t)
	case t.Effect == "":
		st := t.Status
		if st == 0 {
			st = http.StatusConflict
		}
		writeStatus(client, st, "berth egress: "+t.Message)
		return true, nil
	}
	if t.SetKey != "" {
		req.Header.Set("Idempotency-Key", t.SetKey)
	}
	if len(body) == 0 {
		req.Body = http.NoBody
	} else {
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	req.ContentLength, req.TransferEncoding = int64(len(body)), nil
	start := time.Now()
	fail := func(err error) (bool, error) {
		led.Finish(context.WithoutCancel(ctx), t.Effect, Outcome{Err: err, Duration: time.Since(start)})
		return true, err
	}
	if err := ready(); err != nil {
		// Nothing of it went upstream: the intent is withdrawn, not unknown.
		led.Finish(context.WithoutCancel(ctx), t.Effect, Outcome{Err: err, NotSent: true, Duration: time.Since(start)})
		return true, err
	}
	if err := req.Write(up); err != nil {
		return fail(err)
	}
	var resp *http.Response
	for {
		if resp, err = http.ReadResponse(ubr, req); err != nil {
			return fail(err)
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		// 1xx: relayed, the final answer follows.
		if err := resp.Write(client); err != nil {
			return fail(err)
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// No upgrades on a recorded request: the ledger could not see what follows.
		return fail(io.ErrUnexpectedEOF)
	}
	resp.Header.Set(EffectHeader, t.Effect)
	buf, err := io.ReadAll(io.LimitReader(resp.Body, MaxReplayBody+1))
	if err != nil {
		return fail(err)
	}
	out := Outcome{Status: resp.StatusCode, Header: replayHeader(resp.Header)}
	if len(buf) <= MaxReplayBody {
		// The whole answer is here: relayed, then recorded (the ledger
		// holds a repeat that arrives meanwhile until the outcome is
		// stored, so the sandbox never waits for the store itself).
		out.Body, out.Complete, out.Size = buf, out.Header != nil, int64(len(buf))
		out.Duration = time.Since(start)
		if req.Method != http.MethodHead {
			resp.ContentLength, resp.TransferEncoding = int64(len(buf)), nil
		}
		resp.Body = io.NopCloser(bytes.NewReader(buf))
		werr := resp.Write(client)
		led.Finish(context.WithoutCancel(ctx), t.Effect, out)
		if werr != nil {
			return true, werr
		}
		return req.Close || resp.Close, nil
	}
	cr := &countingReader{r: io.MultiReader(bytes.NewReader(buf), resp.Body)}
	resp.Body = io.NopCloser(cr)
	werr := resp.Write(client)
	out.Size, out.Duration = cr.n, time.Since(start)
	if werr != nil && cr.err != nil {
		out.Err = cr.err // the upstream broke off: what it did is unknown
	}
	led.Finish(context.WithoutCancel(ctx), t.Effect, out)
	if werr != nil {
		return true, werr
	}
	return req.Close || resp.Close, nil
}

// replayHeader is the part of a response head kept for replay (nil when
// it is too large to keep): every header but the hop-by-hop ones and the
// framing, which a replay recomputes.
func replayHeader(h http.Header) http.Header {
	out := http.Header{}
	size := 0
	for k, vs := range h {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length", "Trailer", "Upgrade", EffectHeader:
			continue
		}
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
		out[k] = append([]string(nil), vs...)
	}
	if size > maxReplayHeader {
		return nil
	}
	return out
}

// writeReplay answers req from a recorded response.
func writeReplay(w io.Writer, req *http.Request, t Ticket) error {
	h := t.Replay.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set(EffectHeader, t.Effect+"; replayed")
	resp := &http.Response{StatusCode: t.Replay.Status, ProtoMajor: 1, ProtoMinor: 1, Header: h, Request: req,
		ContentLength: int64(len(t.Replay.Body)), Body: io.NopCloser(bytes.NewReader(t.Replay.Body))}
	return resp.Write(w)
}

type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}
