package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Module is the module path of the planact repository.
const Module = "github.com/planact/planact"

// Binaries are the programs the topology runs.
type Binaries struct {
	Planact    string
	NATSServer string
	// RetentionFlags reports whether `planact serve` takes --history and
	// --result-retention; without them retention cannot be shortened and
	// the leftover check reports what a run leaves behind.
	RetentionFlags bool
}

// RepoRoot finds the planact repository from dir upwards (the directory
// holding go.mod for Module).
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(data)), "module "+Module) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod of %s at or above %s", Module, dir)
		}
	}
}

// Build compiles planact (./cmd/planact) and nats-server (the module
// version in go.mod, from the module cache) into dir.
func Build(ctx context.Context, root, dir string) (Binaries, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	b := Binaries{Planact: filepath.Join(dir, "planact"), NATSServer: filepath.Join(dir, "nats-server")}
	for _, t := range []struct{ out, pkg string }{
		{b.Planact, "./cmd/planact"},
		{b.NATSServer, "github.com/nats-io/nats-server/v2"},
	} {
		cmd := exec.CommandContext(ctx, goTool, "build", "-o", t.out, t.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go build %s: %w\n%s", t.pkg, err, out)
		}
	}
	help, _ := exec.CommandContext(ctx, b.Planact, "serve", "-h").CombinedOutput()
	b.RetentionFlags = bytes.Contains(help, []byte("-history")) && bytes.Contains(help, []byte("-result-retention"))
	return b, nil
}
