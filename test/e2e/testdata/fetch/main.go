// Command fetch is the e2e tests' HTTP(S) client inside a sandbox (busybox
// wget's TLS cannot talk to Go servers). It trusts the system roots, which
// Go reads from SSL_CERT_FILE / SSL_CERT_DIR.
//
//	fetch [-H 'K: V']... [-X METHOD] [-d BODY | -d @N] URL[|HOST]...
//	    GETs each URL in turn on one client, so a second URL to the same
//	    server reuses the kept-alive connection ("[reused]" is printed
//	    then); |HOST sends that Host header instead of the URL's. "$NAME"
//	    in a header value or a URL is taken from the environment. Prints
//	    the bodies; exits 1 if any request fails or is not a 200. -X and
//	    -d send another method with a body (@N: N bytes of "a"); a
//	    Berth-Effect answer header is printed as "effect=VALUE".
//	fetch -hold N -for D ADDR
//	    opens N TCP connections to ADDR at once, keeps them for D, and
//	    prints "open K": how many the far side had not closed or reset.
//	fetch -lookup N PATTERN
//	    resolves N names (PATTERN with %d) at once and prints "resolved K".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type headers []string

func (h *headers) String() string     { return strings.Join(*h, ", ") }
func (h *headers) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	var hs headers
	flag.Var(&hs, "H", "header K: V (repeatable)")
	hold := flag.Int("hold", 0, "open this many TCP connections to ADDR and hold them")
	holdFor := flag.Duration("for", 10*time.Second, "how long -hold keeps its connections")
	lookup := flag.Int("lookup", 0, "resolve this many names from PATTERN at once")
	flag.StringVar(&method, "X", "GET", "request method")
	flag.StringVar(&data, "d", "", "request body (@N: N bytes of \"a\")")
	flag.Parse()
	switch {
	case *hold > 0:
		holdConns(*hold, *holdFor, flag.Arg(0))
	case *lookup > 0:
		lookupNames(*lookup, flag.Arg(0))
	default:
		os.Exit(get(hs, flag.Args()))
	}
}

var method, data string

func body() io.Reader {
	if n, err := strconv.Atoi(strings.TrimPrefix(data, "@")); err == nil && strings.HasPrefix(data, "@") {
		return io.LimitReader(repeatA{}, int64(n))
	}
	if data == "" {
		return nil
	}
	return strings.NewReader(data)
}

type repeatA struct{}

func (repeatA) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = 'a'
	}
	return len(b), nil
}

func get(hs headers, targets []string) int {
	c := &http.Client{Timeout: 15 * time.Second}
	code := 0
	for _, target := range targets {
		url, host, _ := strings.Cut(target, "|")
		req, err := http.NewRequest(method, os.ExpandEnv(url), body())
		if err != nil {
			fmt.Println(err)
			return 1
		}
		if host != "" {
			req.Host = host
		}
		for _, h := range hs {
			k, v, _ := strings.Cut(h, ":")
			req.Header.Set(strings.TrimSpace(k), os.ExpandEnv(strings.TrimSpace(v)))
		}
		reused := false
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := c.Do(req)
		if reused {
			fmt.Println("[reused]")
		}
		if err != nil {
			fmt.Println(err)
			code = 1
			continue
		}
		if e := resp.Header.Get("Berth-Effect"); e != "" {
			fmt.Println("effect=" + e)
		}
		_, _ = io.Copy(os.Stdout, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			fmt.Println("HTTP", resp.StatusCode)
			code = 1
		}
	}
	return code
}

func holdConns(n int, d time.Duration, addr string) {
	var open atomic.Int32
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return
			}
			defer c.Close()
			// Still open after the proxy's peek and dial: a read times out.
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			var b [1]byte
			if _, err := c.Read(b[:]); err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					open.Add(1)
					time.Sleep(d)
				}
			}
		})
	}
	wg.Wait()
	fmt.Println("open", open.Load())
}

func lookupNames(n int, pattern string) {
	var ok atomic.Int32
	var wg sync.WaitGroup
	r := &net.Resolver{PreferGo: true}
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := r.LookupNetIP(ctx, "ip4", fmt.Sprintf(pattern, i)); err == nil {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	fmt.Println("resolved", ok.Load())
}
