// Command fakeagent is a hostile agent for the channel trust-boundary test
// (test/e2e/channel_test.go). Run as root inside a sandbox:
//
//	fakeagent nokey SOCKET   dial SOCKET many times: garbage, wrong keys, idle handshakes
//	fakeagent key SOCKET [HEXKEY]  authenticate with the sandbox's real key (HEXKEY,
//	                         else read from /proc/1/environ when readable) and
//	                         answer every request with 1 GiB of JSON
//
// It writes "connected" to /tmp/fakeagent.state once authenticated.
package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: fakeagent nokey|key SOCKET")
		os.Exit(2)
	}
	sock := os.Args[2]
	switch os.Args[1] {
	case "nokey":
		noKey(sock)
	case "key":
		withKey(sock)
	}
}

// noKey tries what an attacker without the key can: every attempt must be refused.
func noKey(sock string) {
	wrong := make([]byte, agentapi.KeySize)
	_, _ = rand.Read(wrong)
	id := os.Getenv("BERTH_SANDBOX_ID")
	if id == "" {
		id = "x"
	}
	refused, accepted := 0, 0
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := net.Dial("unix", sock)
			if err != nil {
				return
			}
			defer c.Close()
			switch i % 4 {
			case 0: // wrong key
				err = agentapi.AgentHandshake(c, id, wrong)
			case 1: // plain HTTP, as the old agent socket spoke
				_, _ = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: agent\r\n\r\n")
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				b, _ := io.ReadAll(io.LimitReader(c, 1024))
				if len(b) > 0 {
					err = nil
				} else {
					err = fmt.Errorf("no answer")
				}
			case 2: // a huge hello
				_, _ = c.Write(append([]byte("berthch1\xff"), bytes.Repeat([]byte("a"), 1<<20)...))
				err = fmt.Errorf("sent")
			case 3: // hold a handshake open and say nothing
				time.Sleep(time.Second)
				err = fmt.Errorf("idle")
			}
			mu.Lock()
			if err == nil {
				accepted++
			} else {
				refused++
			}
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	fmt.Printf("accepted=%d refused=%d\n", accepted, refused)
}

func environ1(name string) string {
	b, err := os.ReadFile("/proc/1/environ")
	if err != nil {
		return ""
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// withKey holds the sandbox's real key (as a sandbox root that learnt it
// would: it is its own sandbox's) and answers every request with 1 GiB of JSON.
func withKey(sock string) {
	hexKey := environ1("BERTH_AGENT_KEY")
	if len(os.Args) > 3 {
		hexKey = os.Args[3]
	}
	var key []byte
	if _, err := fmt.Sscanf(hexKey, "%x", &key); err != nil || len(key) != agentapi.KeySize {
		fmt.Fprintln(os.Stderr, "fakeagent: no key in /proc/1/environ")
		os.Exit(1)
	}
	id := os.Getenv("BERTH_SANDBOX_ID")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = os.WriteFile("/tmp/fakeagent.served", []byte(r.URL.Path+"\n"), 0o644)
		if r.URL.Path == "/exec" {
			io.WriteString(w, `{"type":"start","pid":1}`+"\n")
		}
		io.WriteString(w, `{"type":"stdout","data":"`)
		chunk := bytes.Repeat([]byte("A"), 1<<20)
		for i := 0; i < 1024; i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	// Redial without backoff so this agent holds the channel most of the time.
	for {
		c, err := net.Dial("unix", sock)
		if err != nil {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err := agentapi.AgentHandshake(c, id, key); err != nil {
			c.Close()
			time.Sleep(5 * time.Millisecond)
			continue
		}
		_ = os.WriteFile("/tmp/fakeagent.state", []byte("connected\n"), 0o644)
		_ = agentapi.ServeConn(c, h)
	}
}
