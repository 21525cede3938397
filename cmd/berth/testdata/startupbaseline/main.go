// Command startupbaseline is the trivial Go program berth's start-up test
// measures `berth help` against: the Go runtime's start and one write.
package main

import "os"

func main() { os.Stdout.WriteString("berth — sandboxes for AI agents\n") }
