package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

// Create a sandbox, run a command in it, and remove it.
func Example() {
	ctx := context.Background()
	c := client.New(client.DefaultURL, os.Getenv("BERTH_API_KEY"))
	sb, err := c.Create(ctx, wire.CreateRequest{Template: "default", TTL: "30m"})
	if err != nil {
		log.Fatal(err)
	}
	box := c.Sandbox(sb.ID)
	defer box.Delete(context.WithoutCancel(ctx))

	code, err := box.Run(ctx, wire.ExecRequest{Cmd: []string{"uname", "-a"}}, os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", code)
}

// Stream a command's events one by one and feed it stdin.
func ExampleSandbox_Exec() {
	ctx := context.Background()
	c, err := client.FromEnv() // BERTH_URL, BERTH_API_KEY
	if err != nil {
		log.Fatal(err)
	}
	box := c.Sandbox("k3x9m2p7q4w8e1r5t6y0")
	p, err := box.Exec(ctx, wire.ExecRequest{Cmd: []string{"wc", "-c"}, Stdin: true})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	for {
		ev, err := p.Next()
		if err != nil {
			log.Fatal(err)
		}
		switch ev.Type {
		case wire.ExecStart:
			_ = box.WriteStdin(ctx, p.Pid, []byte("hello"))
			_ = box.CloseStdin(ctx, p.Pid)
		case wire.ExecStdout:
			fmt.Print(string(ev.Data))
		case wire.ExecExit:
			fmt.Println("exit", ev.ExitCode)
			return
		}
	}
}

// Files go in and out as streams.
func ExampleSandbox_WriteFile() {
	ctx := context.Background()
	c := client.New(client.DefaultURL, os.Getenv("BERTH_API_KEY"))
	box := c.Sandbox("k3x9m2p7q4w8e1r5t6y0")
	if _, err := box.WriteFile(ctx, "/home/user/hello.txt", strings.NewReader("hi\n"), client.WriteFileOptions{Mode: 0o600}); err != nil {
		log.Fatal(err)
	}
	r, err := box.ReadFile(ctx, "/home/user/hello.txt", "")
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	_, _ = os.Stdout.ReadFrom(r)
}

// Pause to disk, resume, and fork: the answers say which mode was taken.
func ExampleSandbox_Pause() {
	ctx := context.Background()
	c := client.New(client.DefaultURL, os.Getenv("BERTH_API_KEY"))
	box := c.Sandbox("k3x9m2p7q4w8e1r5t6y0")
	sb, err := box.Pause(ctx, wire.PauseMemory)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("paused as", sb.PauseActual, sb.Message)
	if _, err := box.Resume(ctx); err != nil {
		log.Fatal(err)
	}
	res, err := box.Fork(ctx, 2)
	if err != nil {
		log.Fatal(err)
	}
	for _, child := range res.Sandboxes {
		fmt.Println("child", child.ID, res.Mode)
	}
}

// Errors carry the server's kind and the offending field.
func ExampleError() {
	ctx := context.Background()
	c := client.New(client.DefaultURL, os.Getenv("BERTH_API_KEY"))
	_, err := c.Create(ctx, wire.CreateRequest{TTL: "soon"})
	var ae *client.Error
	if errors.As(err, &ae) {
		fmt.Println(ae.StatusCode, ae.Kind, ae.Field) // 400 invalid_argument ttl
	}
}
