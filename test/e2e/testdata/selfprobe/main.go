// Command selfprobe attacks the in-sandbox API from inside a sandbox
// (test/e2e/self_test.go). Run as root (it reads the sandbox's channel key
// from /proc/1/environ, as a sandbox root can):
//
//	selfprobe caller ID [derive-for OTHER]  dial /run/berth/agent.sock as a caller with
//	                        identity ID and the sandbox's own key (or the key
//	                        "derived" from it for OTHER), GET /v1/sandboxes/self;
//	                        prints "answer STATUS BODY" or "refused ERR"
//	selfprobe flood SECONDS  for SECONDS: thousands of requests through the
//	                        agent's socket, 2 MiB bodies, slowloris connections
//	                        on both the agent's socket and the channel socket;
//	                        prints the counts as JSON
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
)

const chanSock = "/run/berth/agent.sock"

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: selfprobe caller ID [derive-for OTHER] | flood SECONDS")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "caller":
		caller(os.Args[2], os.Args[3:])
	case "flood":
		n, _ := strconv.Atoi(os.Args[2])
		flood(time.Duration(n) * time.Second)
	default:
		os.Exit(2)
	}
}

// ownKey is the sandbox's channel key: $SELFPROBE_KEY, else as a sandbox
// root may find it in PID 1's environment; where even root cannot read
// that, a random key
// (keyless is set: the attacks below are then guesses).
func ownKey() []byte {
	if k, err := hex.DecodeString(os.Getenv("SELFPROBE_KEY")); err == nil && len(k) == agentapi.KeySize {
		return k // handed in by the test: a root that got the key some other way (ptrace)
	}
	if b, err := os.ReadFile("/proc/1/environ"); err == nil {
		for _, kv := range strings.Split(string(b), "\x00") {
			if v, ok := strings.CutPrefix(kv, "BERTH_AGENT_KEY="); ok {
				if k, err := hex.DecodeString(v); err == nil {
					return k
				}
			}
		}
	}
	keyless = true
	k := make([]byte, agentapi.KeySize)
	_, _ = rand.Read(k)
	return k
}

var keyless bool

func say(format string, args ...any) {
	if keyless {
		fmt.Print("nokey ")
	}
	fmt.Printf(format+"\n", args...)
}

func caller(id string, rest []string) {
	key := ownKey()
	if len(rest) == 2 && rest[0] == "derive-for" {
		key = agentapi.DeriveKey(key, rest[1]) // a guess: the sandbox's key as a master
	}
	conn, err := net.Dial("unix", chanSock)
	if err != nil {
		say("refused %v", err)
		return
	}
	defer conn.Close()
	if err := agentapi.CallerHandshake(conn, id, key); err != nil {
		say("refused %v", err)
		return
	}
	fmt.Fprintf(conn, "GET /v1/sandboxes/self HTTP/1.1\r\nHost: berth\r\nX-API-Key: forged\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		say("refused %v", err)
		return
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	say("answer %d %s", resp.StatusCode, bytes.TrimSpace(b))
}

func flood(d time.Duration) {
	sock := os.Getenv("BERTH_API_SOCKET")
	if sock == "" {
		sock = "/run/berth-agent/api.sock"
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", sock)
		},
		MaxIdleConnsPerHost: 64,
	}, Timeout: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	counts := map[string]int{}
	add := func(k string) { mu.Lock(); counts[k]++; mu.Unlock() }
	var sent atomic.Int64
	var wg sync.WaitGroup
	// Many requests at once through the agent's socket.
	for range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://berth/v1/sandboxes/self", nil)
				resp, err := hc.Do(req)
				sent.Add(1)
				if err != nil {
					add("error")
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				add(strconv.Itoa(resp.StatusCode))
			}
		}()
	}
	// Huge bodies, declared and chunked.
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			big := bytes.Repeat([]byte("x"), 2<<20)
			for i := 0; ctx.Err() == nil; i++ {
				var body io.Reader = bytes.NewReader(big)
				if i%2 == 1 {
					body = io.MultiReader(bytes.NewReader(big)) // no length: chunked
				}
				req, _ := http.NewRequestWithContext(ctx, "POST", "http://berth/v1/sandboxes/self/tasks", body)
				resp, err := hc.Do(req)
				if err != nil {
					add("big_error")
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				add("big_" + strconv.Itoa(resp.StatusCode))
			}
		}()
	}
	// Slowloris on the agent's socket: a header byte every second.
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, err := net.Dial("unix", sock)
				if err != nil {
					add("slow_dial_error")
					time.Sleep(100 * time.Millisecond)
					continue
				}
				_, _ = c.Write([]byte("GET /v1/sandboxes/self HTTP/1.1\r\nHost: b\r\n"))
				for ctx.Err() == nil {
					if _, err := c.Write([]byte("X-A: b\r\n")); err != nil {
						break
					}
					time.Sleep(time.Second)
				}
				c.Close()
			}
		}()
	}
	// Slowloris and half handshakes on the channel socket itself.
	key := ownKey()
	id := os.Getenv("BERTH_SANDBOX_ID")
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, err := net.Dial("unix", chanSock)
				if err != nil {
					add("chan_dial_error")
					time.Sleep(50 * time.Millisecond)
					continue
				}
				if err := agentapi.CallerHandshake(c, id, key); err != nil {
					add("chan_refused")
					c.Close()
					time.Sleep(10 * time.Millisecond)
					continue
				}
				add("chan_caller")
				_, _ = c.Write([]byte("GET /v1/sandboxes/self HTTP/1.1\r\n"))
				for ctx.Err() == nil {
					if _, err := c.Write([]byte("X: y\r\n")); err != nil {
						break
					}
					time.Sleep(time.Second)
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	counts["sent"] = int(sent.Load())
	b, _ := json.Marshal(counts)
	fmt.Println(string(b))
}
