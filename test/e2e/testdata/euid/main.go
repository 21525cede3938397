// euid prints its effective user id: planted setuid-root by a sandbox, it
// tells the host test whether running it gains root.
package main

import (
	"fmt"
	"os"
)

func main() { fmt.Println(os.Geteuid()) }
