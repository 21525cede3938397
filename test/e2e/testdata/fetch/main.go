// Command fetch is the e2e tests' HTTPS client inside a sandbox (busybox
// wget's TLS cannot talk to Go servers): fetch [-H 'K: V']... URL prints
// the body and exits 1 on any error. It trusts the system roots, which Go
// reads from SSL_CERT_FILE / SSL_CERT_DIR. A header value "$NAME" is taken
// from the environment.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

type headers []string

func (h *headers) String() string     { return strings.Join(*h, ", ") }
func (h *headers) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	var hs headers
	flag.Var(&hs, "H", "header K: V (repeatable)")
	flag.Parse()
	req, err := http.NewRequest("GET", flag.Arg(0), nil)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	for _, h := range hs {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), os.ExpandEnv(strings.TrimSpace(v)))
	}
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(os.Stdout, resp.Body)
	if resp.StatusCode != 200 {
		fmt.Println("HTTP", resp.StatusCode)
		os.Exit(1)
	}
}
