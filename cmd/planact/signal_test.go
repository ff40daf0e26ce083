package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildPlanact builds this command into a temporary directory, for tests
// that run it as a process of its own (signals, exit statuses).
func buildPlanact(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "planact")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// waitExit waits for cmd to exit, up to a minute, and returns its exit
// status; it fails the test when cmd was killed by a signal instead of
// exiting, or did not stop.
func waitExit(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s still ran a minute after it was told to stop", cmd.Path)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("%s was killed by %v instead of exiting (%v)", cmd.Path, ws.Signal(), err)
	}
	return cmd.ProcessState.ExitCode()
}

// TestParseStopsOnSIGTERM: `planact parse` reading a stdin that stays open
// stops on SIGTERM, saying so, with status 130 (it waited for the end of
// its input, ignoring the signal).
func TestParseStopsOnSIGTERM(t *testing.T) {
	bin := buildPlanact(t)
	cmd := exec.Command(bin, "parse")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// More than a pipe holds: once the write returns, parse is reading its
	// input (its signal handling was set up before).
	if _, err := stdin.Write([]byte(strings.Repeat("<graph>\n", 64<<10))); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd); code != 130 || strings.TrimSpace(stderr.String()) != "planact: interrupted" || stdout.Len() > 0 {
		t.Errorf("parse on SIGTERM, its stdin open: exit %d, stderr %q, stdout %q; want 130 and \"planact: interrupted\"", code, stderr.String(), stdout.String())
	}
}
