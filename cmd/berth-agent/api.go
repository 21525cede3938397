package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agent"
	"github.com/berth-dev/berth/internal/agentapi"
)

const apiUsage = `usage: berth-agent api METHOD PATH [JSON|-]

Calls berth's in-sandbox API as this sandbox, through the agent's socket
($BERTH_API_SOCKET, default ` + agent.APISocketPath + `), and prints the answer's body.
PATH is a REST path under /v1; "self" stands for this sandbox's id:

  berth-agent api GET /v1/sandboxes/self
  berth-agent api POST /v1/sandboxes/self/tasks '{"name":"build"}'
  echo '{"name":"build"}' | berth-agent api POST /v1/sandboxes/self/tasks -

The body is a JSON argument, or "-" to read it from stdin (at most 1 MiB).
--times N sends the request N times over one kept-alive connection and
prints each round trip in microseconds instead of the body (berth bench).
Only the routes berth allows from inside a sandbox answer; others are 403.
Exit status: 0 on a 2xx answer; 1 otherwise (the error on stderr); 2 on a
usage error.
`

// runAPI is `berth-agent api ...`; it returns the exit status.
func runAPI(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(stdout, apiUsage)
		return 0
	}
	times := 0
	if len(args) > 1 && args[0] == "--times" {
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 || n > 100000 {
			fmt.Fprintf(stderr, "berth-agent api: --times must be 1..100000, got %q\n", args[1])
			return 2
		}
		times, args = n, args[2:]
	}
	if len(args) < 2 || len(args) > 3 {
		fmt.Fprint(stderr, apiUsage)
		return 2
	}
	method, path := strings.ToUpper(args[0]), args[1]
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodHead:
	default:
		fmt.Fprintf(stderr, "berth-agent api: METHOD must be GET, POST, PUT, PATCH, DELETE or HEAD, got %q\n", args[0])
		return 2
	}
	if !strings.HasPrefix(path, "/") {
		fmt.Fprintf(stderr, "berth-agent api: PATH must start with /, got %q\n", path)
		return 2
	}
	var body []byte
	if len(args) == 3 {
		if args[2] == "-" {
			b, err := io.ReadAll(io.LimitReader(stdin, agentapi.MaxCallerRequest+1))
			if err != nil {
				fmt.Fprintln(stderr, "berth-agent api: read stdin:", err)
				return 2
			}
			if len(b) > agentapi.MaxCallerRequest {
				fmt.Fprintf(stderr, "berth-agent api: the body exceeds %d bytes\n", agentapi.MaxCallerRequest)
				return 2
			}
			body = b
		} else {
			body = []byte(args[2])
		}
		if !json.Valid(body) {
			fmt.Fprintln(stderr, "berth-agent api: the body is not valid JSON")
			return 2
		}
	}
	sock := os.Getenv("BERTH_API_SOCKET")
	if sock == "" {
		sock = agent.APISocketPath
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}, Timeout: 5 * time.Minute}
	if times > 0 {
		return timeAPI(hc, times, method, path, body, stdout, stderr)
	}
	req, err := http.NewRequest(method, "http://berth"+path, bytes.NewReader(body))
	if err != nil {
		fmt.Fprintln(stderr, "berth-agent api:", err)
		return 2
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "berth-agent api:", err)
		return 1
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e agentapi.Error
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			fmt.Fprintf(stderr, "berth-agent api: %s %s: %d %s: %s\n", method, path, resp.StatusCode, e.Code, e.Message)
		} else {
			fmt.Fprintf(stderr, "berth-agent api: %s %s: %s %s\n", method, path, resp.Status, bytes.TrimSpace(b))
		}
		return 1
	}
	if _, err := io.Copy(stdout, resp.Body); err != nil {
		fmt.Fprintln(stderr, "berth-agent api: read answer:", err)
		return 1
	}
	return 0
}

// timeAPI sends the request n times and prints each round trip (request
// sent → body read) in microseconds; 1 if any answer is not 2xx.
func timeAPI(hc *http.Client, n int, method, path string, body []byte, stdout, stderr io.Writer) int {
	for range n {
		req, err := http.NewRequest(method, "http://berth"+path, bytes.NewReader(body))
		if err != nil {
			fmt.Fprintln(stderr, "berth-agent api:", err)
			return 2
		}
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			fmt.Fprintln(stderr, "berth-agent api:", err)
			return 1
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if err != nil || resp.StatusCode/100 != 2 {
			fmt.Fprintf(stderr, "berth-agent api: %s %s: %s %v\n", method, path, resp.Status, err)
			return 1
		}
		fmt.Fprintln(stdout, d.Microseconds())
	}
	return 0
}
