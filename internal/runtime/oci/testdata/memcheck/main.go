// memcheck fills a buffer of os.Args[1] MiB with a pattern that depends on
// each word's offset, writes DIR/ready, and whenever DIR/check appears
// verifies every word and writes DIR/result: "ok N" (N MiB checked) or
// "bad OFFSET". DIR is os.Args[2], default /x. A test checkpoints and
// restores it between checks.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"time"
)

func word(i int) uint64 { return uint64(i)*0x9E3779B97F4A7C15 ^ 0x5DEECE66D }

func main() {
	mib, err := strconv.Atoi(os.Args[1])
	if err != nil {
		panic(err)
	}
	dir := "/x"
	if len(os.Args) > 2 {
		dir = os.Args[2]
	}
	buf := make([]byte, mib<<20)
	for i := 0; i < len(buf); i += 8 {
		binary.LittleEndian.PutUint64(buf[i:], word(i))
	}
	if err := os.WriteFile(dir+"/ready", []byte("ready\n"), 0o644); err != nil {
		panic(err)
	}
	for {
		if _, err := os.Stat(dir + "/check"); err != nil {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		_ = os.Remove(dir + "/check")
		res := fmt.Sprintf("ok %d\n", mib)
		for i := 0; i < len(buf); i += 8 {
			if binary.LittleEndian.Uint64(buf[i:]) != word(i) {
				res = fmt.Sprintf("bad %d\n", i)
				break
			}
		}
		_ = os.WriteFile(dir+"/result.tmp", []byte(res), 0o644)
		_ = os.Rename(dir+"/result.tmp", dir+"/result")
	}
}
