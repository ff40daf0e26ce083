package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
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

// TestSubmitCancelsOnSIGTERM: `planact submit` told to stop (SIGTERM)
// cancels the rollout it started, says so on stderr, and exits 130; the
// rollout ends aborted, whether it waited at the barrier for the other
// role or ran. It used to exit and leave its arrival waiting.
func TestSubmitCancelsOnSIGTERM(t *testing.T) {
	bin := buildPlanact(t)
	_, url := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Engines slow enough that a started rollout is still running.
	planner, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RolePlanner, Seed: 1, TTFT: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	actor, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RoleActor, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	go func() {
		served <- stack.Serve(sctx, stack.Services, stack.Options{Provision: true, Conn: bus.ConnOptions{URL: url}, Log: bustest.Logger()})
	}()
	defer func() { stop(); <-served }()
	if err := stack.WaitReady(ctx, bus.ConnOptions{URL: url}, stack.Services); err != nil {
		t.Fatal(err)
	}
	watcher := bustest.Conn(t, url)
	trainer, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		rollout int64
		args    []string
		event   string // the status event after which the signal comes
		roles   []string
	}{
		{"waiting at the barrier", 71, []string{"--role", "planner", "--planner-engine", planner}, "arrived", []string{schema.RolePlanner}},
		{"running", 72, []string{"--role", "both", "--planner-engine", planner, "--actor-engine", actor, "--json"}, "started",
			[]string{schema.RolePlanner, schema.RoleActor}},
	} {
		t.Run(c.name, func(t *testing.T) {
			events := make(chan string, 16)
			sub, err := watcher.Subscribe(subject.Status(c.rollout), func(m *nats.Msg) {
				var st schema.Status
				if schema.Unmarshal(m.Data, &st) == nil {
					select {
					case events <- st.Event:
					default: // the events after the one waited for
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			cmd := exec.Command(bin, append([]string{"submit", "--nats", url, "--rollout", fmt.Sprint(c.rollout), "--sim-tasks", "2"}, c.args...)...)
			var stdout, stderr syncBuffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			for seen := ""; seen != c.event; {
				select {
				case seen = <-events:
				case <-ctx.Done():
					_ = cmd.Process.Kill()
					t.Fatalf("no %q event for rollout %d; submit said:\n%s", c.event, c.rollout, stderr.String())
				}
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			code := waitExit(t, cmd)
			want := fmt.Sprintf("rollout %d: interrupted — cancelling it as the planner (both roles get an aborted result)\n"+
				"rollout %d: cancelled: aborted by the planner trainer: planact submit was interrupted\n"+
				"planact: interrupted\n", c.rollout, c.rollout)
			if code != 130 || !strings.HasSuffix(stderr.String(), want) {
				t.Errorf("submit on SIGTERM: exit %d, stderr:\n%s\nwant 130 and stderr ending:\n%s", code, stderr.String(), want)
			}
			// What planact says of the rollout, as any trainer reads it.
			for _, role := range c.roles {
				res, err := trainer.Result(ctx, c.rollout, role)
				if err != nil || res.Status != schema.ResultAborted {
					t.Errorf("the %s's result of rollout %d: %+v, %v; want aborted", role, c.rollout, res, err)
				}
			}
		})
	}
}
