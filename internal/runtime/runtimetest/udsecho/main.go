// Command udsecho listens on a unix socket and answers every connection with
// "hello <hostname>". The conformance suite runs it inside a sandbox to prove
// a socket created in a bind-mounted host dir is reachable from the host.
package main

import (
	"fmt"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: udsecho SOCKET")
		os.Exit(2)
	}
	os.Remove(os.Args[1])
	l, err := net.Listen("unix", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	host, _ := os.Hostname()
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Fprintf(c, "hello %s\n", host)
		c.Close()
	}
}
