package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Code-interpreter rows: @e2b/code-interpreter's path measured in Go over
// the same wire the SDK uses (no node): the E2B control plane's create
// (POST /sandboxes, template code-interpreter-v1, server default runtime
// and resources) and berth's execution server on port 49999 reached through
// the API address with the E2b-Sandbox-Id / E2b-Sandbox-Port headers and the
// sandbox's envd access token (what the SDK does when E2B_SANDBOX_URL is set).
const (
	ciTemplate = "code-interpreter-v1"
	ciPort     = "49999"
	// ciSettle is how long a refilled pool is left alone before a warm
	// sample, so that its members' servers have started their kernels.
	ciSettle = 8 * time.Second

	defCITTI = "Clock starts before the E2B create (POST /sandboxes, template " + ciTemplate + ", no warm pool on it) and stops when " +
		"POST /execute {\"code\":\"1+1\"} on port " + ciPort + " (header-routed through the API address) has streamed a main result with text \"2\" " +
		"and its end_of_execution; kill is outside the clock. A sandbox claimed from a pool is a failed sample."
	defCITTIWarm = "As code-interpreter-tti, with a warm pool of 3 on " + ciTemplate + " (server default runtime and resources, as the E2B create), " +
		"refilled to 3 and left 8 s (the members' kernels start) outside the clock before every create; a create not claimed from the pool is a failed sample."
	defCIRTT = "One running " + ciTemplate + " sandbox whose kernel has answered once: clock starts before POST /execute {\"code\":\"1+1\"} " +
		"on port " + ciPort + " (header-routed, kept-alive connection) and stops at the end of the NDJSON stream, checked to carry text \"2\"."
)

// ciSandbox is what the E2B create answered.
type ciSandbox struct {
	ID    string `json:"sandboxID"`
	Token string `json:"envdAccessToken"`
}

// ciCreate is the E2B SDK's create, as the SDK sends it.
func (r *Runner) ciCreate(ctx context.Context) (ciSandbox, error) {
	body, _ := json.Marshal(map[string]any{"templateID": ciTemplate, "timeout": 600,
		"metadata": map[string]string{"berth-bench": r.label}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.c.Base+"/sandboxes", bytes.NewReader(body))
	if err != nil {
		return ciSandbox{}, err
	}
	req.Header.Set("X-API-Key", r.c.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.ciHTTP().Do(req)
	if err != nil {
		return ciSandbox{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusCreated {
		return ciSandbox{}, fmt.Errorf("POST /sandboxes: %d %s", resp.StatusCode, oneLine(string(b), 200))
	}
	var sb ciSandbox
	if err := json.Unmarshal(b, &sb); err != nil || sb.ID == "" {
		return ciSandbox{}, fmt.Errorf("POST /sandboxes: answer %q", oneLine(string(b), 200))
	}
	return sb, nil
}

// ciClient carries the E2B-wire requests, on kept-alive connections as the
// SDK's own fetch does.
var ciClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}

func (r *Runner) ciHTTP() *http.Client { return ciClient }

// ciExecute runs code in sb's default context and returns the text of the
// main result, reading the stream to its end (bounded).
func (r *Runner) ciExecute(ctx context.Context, sb ciSandbox, code string) (string, error) {
	body, _ := json.Marshal(map[string]string{"code": code})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.c.Base+"/execute", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("E2b-Sandbox-Id", sb.ID)
	req.Header.Set("E2b-Sandbox-Port", ciPort)
	req.Header.Set("X-Access-Token", sb.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.ciHTTP().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return "", fmt.Errorf("POST /execute: %d %s", resp.StatusCode, oneLine(string(b), 200))
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var text string
	ended := false
	for sc.Scan() {
		var m struct {
			Type   string `json:"type"`
			Main   bool   `json:"is_main_result"`
			Text   string `json:"text"`
			Name   string `json:"name"`
			Value  string `json:"value"`
			Stderr string `json:"stderr"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return "", fmt.Errorf("POST /execute: line %q", oneLine(sc.Text(), 100))
		}
		switch m.Type {
		case "result":
			if m.Main {
				text = m.Text
			}
		case "error":
			return "", fmt.Errorf("runCode: %s: %s", m.Name, m.Value)
		case "end_of_execution":
			ended = true
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if !ended {
		return "", fmt.Errorf("POST /execute: the stream ended without end_of_execution")
	}
	return text, nil
}

// ciKill deletes a sandbox through the E2B API, outside any clock.
func (r *Runner) ciKill(ctx context.Context, id string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(dctx, http.MethodDelete, r.c.Base+"/sandboxes/"+id, nil)
	if err != nil {
		return
	}
	req.Header.Set("X-API-Key", r.c.Key)
	resp, err := r.ciHTTP().Do(req)
	if err != nil {
		r.logf("kill %s: %v", id, err)
		return
	}
	resp.Body.Close()
}

// ciUnavailable says why the code-interpreter rows cannot be measured, or "".
func (r *Runner) ciUnavailable(ctx context.Context) string {
	if !TemplateReady(ctx, r.c, ciTemplate) {
		return "not available: the " + ciTemplate + " template is absent (scripts/code-interpreter-template.sh puts it in)"
	}
	return ""
}

// ciTTISample is one create → first 1+1 result; pooled says whether the
// sandbox must (true) or must not (false) have been claimed from a pool.
func (r *Runner) ciTTISample(ctx context.Context, pooled bool) (time.Duration, error) {
	t0 := time.Now()
	sb, err := r.ciCreate(ctx)
	if err != nil {
		return 0, err
	}
	defer r.ciKill(ctx, sb.ID)
	text, err := r.ciExecute(ctx, sb, "1+1")
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if text != "2" {
		return 0, fmt.Errorf("runCode('1+1') = %q", text)
	}
	got, err := r.c.Sandbox(sb.ID).Get(ctx)
	if err != nil {
		return 0, err
	}
	if claimed := got.Extra["claimed_from_pool"] != ""; claimed != pooled {
		return 0, fmt.Errorf("%s: claimed from a pool: %v, want %v", sb.ID, claimed, pooled)
	}
	return d, nil
}

func (r *Runner) ciTTI(ctx context.Context) Metric {
	m := Metric{Name: "code-interpreter-tti", Unit: "ms", Definition: defCITTI}
	if why := r.ciUnavailable(ctx); why != "" {
		m.Reason = why
		return m
	}
	if _, had, err := r.c.Pool(ctx, ciTemplate); err == nil && had {
		m.Reason = "the server has a warm pool on " + ciTemplate + "; a cold create needs none"
		return m
	}
	m.Available = true
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) { return r.ciTTISample(ctx, false) })
	return m
}

func (r *Runner) ciTTIWarm(ctx context.Context) Metric {
	m := Metric{Name: "code-interpreter-tti-warm", Unit: "ms", Definition: defCITTIWarm}
	if why := r.ciUnavailable(ctx); why != "" {
		m.Reason = why
		return m
	}
	if _, err := r.c.Pools(ctx); noRoute(err) {
		m.Reason = "warm pools have not landed: the server does not serve /v1/pools"
		return m
	}
	wp, err := r.setWarmPool(ctx, ciTemplate, "")
	if wp != nil {
		defer wp.restore(ctx)
	}
	if err != nil {
		m.Reason = "warm pool: " + err.Error()
		return m
	}
	m.Available = true
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		if _, err := wp.waitFull(ctx, poolRefillLimit); err != nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(ciSettle):
		}
		return r.ciTTISample(ctx, true)
	})
	m.Derived = wp.counters(ctx)
	return m
}

func (r *Runner) ciRTT(ctx context.Context) Metric {
	m := Metric{Name: "code-interpreter-rtt", Unit: "ms", Definition: defCIRTT}
	if why := r.ciUnavailable(ctx); why != "" {
		m.Reason = why
		return m
	}
	sb, err := r.ciCreate(ctx)
	if err != nil {
		m.Reason = err.Error()
		return m
	}
	defer r.ciKill(ctx, sb.ID)
	if _, err := r.ciExecute(ctx, sb, "1+1"); err != nil {
		m.Reason = "first runCode: " + err.Error()
		return m
	}
	m.Available = true
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		text, err := r.ciExecute(ctx, sb, "1+1")
		d := time.Since(t0)
		if err == nil && strings.TrimSpace(text) != "2" {
			err = fmt.Errorf("runCode('1+1') = %q", text)
		}
		return d, err
	})
	return m
}
