// Package natsbin starts a nats-server binary of the system's for a test:
// Debian's nats-server package (2.9) is older than planact needs, and the
// tests check that every planact process refuses it, naming the version.
package natsbin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Server is a nats-server binary of the system's, started with JetStream
// for the test.
type Server struct {
	URL     string
	Version string // as `nats-server --version` prints it, e.g. 2.9.10
}

// Old starts a nats-server of the system's that is older than planact
// needs (Debian's package: /usr/sbin/nats-server, 2.9) with JetStream on a
// free loopback port, stopped at the end of the test. The test is skipped,
// saying why, when there is none.
func Old(t testing.TB) Server {
	t.Helper()
	var bins []string
	if bin, err := exec.LookPath("nats-server"); err == nil {
		bins = append(bins, bin)
	}
	bins = append(bins, "/usr/sbin/nats-server") // off a user's PATH
	var bin, version string
	var seen []string
	for _, b := range bins {
		out, err := exec.Command(b, "--version").CombinedOutput()
		if err != nil {
			continue
		}
		// "nats-server: v2.9.10"
		v := strings.TrimPrefix(strings.TrimSpace(string(out[bytes.LastIndexByte(out, ' ')+1:])), "v")
		if older(v, 2, 12) {
			bin, version = b, v
			break
		}
		seen = append(seen, b+" "+v)
	}
	if bin == "" {
		t.Skipf("no nats-server older than 2.12 here (%v): apt-get install -y nats-server (.ci/run does) to test against Debian's (2.9)", seen)
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, "-js", "-a", "127.0.0.1", "-p", "-1", "-sd", filepath.Join(dir, "js"), "--ports_file_dir", dir)
	log, err := os.Create(filepath.Join(dir, "nats-server.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
	})
	// The server writes the addresses it listens on to a ports file once
	// it accepts clients.
	ports := filepath.Join(dir, fmt.Sprintf("%s_%d.ports", filepath.Base(bin), cmd.Process.Pid))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var p struct {
			Nats []string `json:"nats"`
		}
		if data, err := os.ReadFile(ports); err == nil && json.Unmarshal(data, &p) == nil && len(p.Nats) > 0 {
			return Server{URL: p.Nats[0], Version: version}
		}
		if time.Now().After(deadline) {
			data, _ := os.ReadFile(log.Name())
			t.Fatalf("%s wrote no ports file %s:\n%s", bin, ports, data)
		}
	}
}

// older says whether version v ("2.9.10") is older than major.minor.
func older(v string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(v, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma < major || (ma == major && mi < minor)
}
