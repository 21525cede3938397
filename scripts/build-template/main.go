// Command build-template builds the built-in template tars into the host
// cache (default /var/cache/berth/rootfs) so setup and CI reuse them, and
// optionally imports them into a data dir's layer store. scripts/setup.sh
// runs it; it prints one progress line per step and the tar path(s) last.
//
//	go run ./scripts/build-template [-cache DIR] [-import DATA_DIR] [-mirror URL] default|tiny...
//
// The default template is debootstrapped from the host's Debian mirror (its
// apt sources); -mirror or BERTH_DEBIAN_MIRROR overrides it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/template"
)

func main() {
	cache := flag.String("cache", template.DefaultCacheDir, "directory for built template tars")
	importTo := flag.String("import", "", "also import the tars into this data dir's layer store")
	mirror := flag.String("mirror", "", "Debian mirror URL for the default template (default: $"+template.MirrorEnv+", else the host's apt sources)")
	flag.Parse()
	names := flag.Args()
	if len(names) == 0 {
		names = []string{template.DefaultName}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log, *cache, *importTo, *mirror, names); err != nil {
		log.Error("build-template failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, cache, importTo, mirror string, names []string) error {
	var store *template.Store
	if importTo != "" {
		s, err := template.Open(importTo, log)
		if err != nil {
			return err
		}
		store = s
	}
	progress := func(p template.Progress) { fmt.Printf("[%s] %s\n", p.Phase, p.Message) }
	for _, name := range names {
		start := time.Now()
		var tarPath string
		var err error
		switch name {
		case template.DefaultName:
			tarPath, err = template.BuildDefaultFrom(ctx, cache, mirror, progress)
		case template.TinyName:
			tarPath, err = template.BuildTiny(ctx, cache, progress)
		default:
			return fmt.Errorf("unknown template %q (want %s or %s)", name, template.DefaultName, template.TinyName)
		}
		if err != nil {
			return fmt.Errorf("build %s: %w", name, err)
		}
		fi, err := os.Stat(tarPath)
		if err != nil {
			return err
		}
		log.Info("template tar ready", "template", name, "path", tarPath, "bytes", fi.Size(), "duration", time.Since(start).Round(time.Millisecond))
		if store != nil {
			start = time.Now()
			l, err := store.ImportFile(ctx, tarPath, nil)
			if err != nil {
				return fmt.Errorf("import %s: %w", name, err)
			}
			log.Info("template layer ready", "template", name, "digest", l.Digest, "duration", time.Since(start).Round(time.Millisecond))
		}
		fmt.Println(tarPath)
	}
	return nil
}
