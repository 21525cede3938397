package cli

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandboxca"
)

// caUsage is `berth ca`'s usage line (also `berth help ca`).
const caUsage = "ca [--data-dir DIR] [--install]   print the PEM certificate of berth's CA for sandbox host names " +
	"(https://<port>-<id>.DOMAIN of `serve --sandbox-domain`), made on first use in DIR/sandbox-ca (default /var/lib/berth, " +
	"or $BERTH_DATA_DIR; root, on the server's host); trust it with NODE_EXTRA_CA_CERTS=FILE or the system store. " +
	"--install puts it into Debian's system trust store (" + caInstallPath + ", then update-ca-certificates). " +
	"With serve --sandbox-tls-cert the operator's certificate is served instead"

// caInstallPath is where Debian's update-ca-certificates picks up local CAs.
const caInstallPath = "/usr/local/share/ca-certificates/berth-sandbox-ca.crt"

// runCA is `berth ca`: it reads (or creates) the CA in the data dir, so it
// runs on the server's host, not through the API: the CA key never leaves
// that directory.
func runCA(e *env, args []string) error {
	fs := flag.NewFlagSet("ca", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	dataDir := fs.String("data-dir", "", "berth's data dir (default $BERTH_DATA_DIR or /var/lib/berth)")
	install := fs.Bool("install", false, "install into the system trust store (Debian: update-ca-certificates)")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() != 0 {
		return usageError{"ca takes no arguments"}
	}
	dir := *dataDir
	if dir == "" {
		dir = os.Getenv("BERTH_DATA_DIR")
	}
	if dir == "" {
		dir = "/var/lib/berth"
	}
	if !filepath.IsAbs(dir) {
		return errs.Field("data-dir", "must be an absolute path, got %q", dir)
	}
	ca, err := sandboxca.LoadOrCreate(sandboxca.Dir(dir))
	if err != nil {
		return err
	}
	pem := ca.CertPEM()
	if !*install {
		_, err := e.stdout.Write(pem)
		return err
	}
	if err := os.MkdirAll(filepath.Dir(caInstallPath), 0o755); err != nil {
		return errs.Wrap(errs.Internal, err, "install CA")
	}
	if err := os.WriteFile(caInstallPath, pem, 0o644); err != nil {
		return errs.Wrap(errs.Internal, err, "install CA")
	}
	cmd := exec.CommandContext(e.ctx, "update-ca-certificates")
	cmd.Stdout, cmd.Stderr = e.stderr, e.stderr
	if err := cmd.Run(); err != nil {
		return errs.Wrap(errs.FailedPrecondition, err, "update-ca-certificates (Debian's ca-certificates package) after writing %s", caInstallPath)
	}
	_, err = e.stdout.Write([]byte("installed " + caInstallPath + "\n"))
	return err
}
