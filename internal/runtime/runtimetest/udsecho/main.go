// Command udsecho dials a unix socket the host listens on and says
// "hello <hostname> listen=<ok|denied>", where listen tells whether it could
// create a socket of its own beside it. The conformance suite runs it
// inside a sandbox to prove the agent channel's shape: a host socket in a
// read-only bind mount is connectable from inside, and nothing can be
// created there.
package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: udsecho SOCKET")
		os.Exit(2)
	}
	listen := "denied"
	if l, err := net.Listen("unix", filepath.Join(filepath.Dir(os.Args[1]), "own.sock")); err == nil {
		listen = "ok"
		l.Close()
	}
	host, _ := os.Hostname()
	for {
		c, err := net.Dial("unix", os.Args[1])
		if err == nil {
			fmt.Fprintf(c, "hello %s listen=%s\n", host, listen)
			c.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
}
