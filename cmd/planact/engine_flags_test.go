package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
)

// TestUpPortsRefused: --port 0 is no port (the embedded server took it
// for 4222, the port the help says nothing of), and a --metrics port that
// is no number was only warned of once everything had started.
func TestUpPortsRefused(t *testing.T) {
	for _, c := range []struct {
		port, monitor int
		metrics       string
		want          string
	}{
		{0, 0, "", "--port 0: want a port from 1 to 65535, or -1"},
		{-2, 0, "", "--port -2"},
		{65536, 0, "", "--port 65536"},
		{-1, -2, "", "--monitor-port -2"},
		{-1, 0, ":abc", `--metrics ":abc"`},
		{-1, 0, "127.0.0.1:70000", `--metrics "127.0.0.1:70000"`},
	} {
		err := checkUpFlags(c.port, c.monitor, 0, 0, c.metrics)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--port %d --monitor-port %d --metrics %q: %v, want an error naming %s", c.port, c.monitor, c.metrics, err, c.want)
		}
	}
	for _, c := range []struct {
		port, monitor int
		metrics       string
	}{{-1, 0, ""}, {4222, -1, "127.0.0.1:9464"}, {1, 65535, ":0"}} {
		if err := checkUpFlags(c.port, c.monitor, 0, 0, c.metrics); err != nil {
			t.Errorf("--port %d --monitor-port %d --metrics %q: %v", c.port, c.monitor, c.metrics, err)
		}
	}
}

// TestEngineFlagsRefused: an engine URL without its scheme, a protocol
// planact does not know, or a history too short for the demo's rollouts,
// is refused naming its flag before anything is sent or started; the
// arrival went out before and was refused by the session-store (up --demo
// played every rollout to a failure, or waited for the actor's partner).
func TestEngineFlagsRefused(t *testing.T) {
	const ok = "http://127.0.0.1:1"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"submit", "--nats", "nats://127.0.0.1:1", "--rollout", "1", "--sim-tasks", "1", "--planner-engine", "localhost:30000", "--actor-engine", ok},
			`submit: --planner-engine "localhost:30000": want an http or https URL: "http://localhost:30000", say`},
		{[]string{"submit", "--nats", "nats://127.0.0.1:1", "--rollout", "1", "--role", "actor", "--actor-engine", "grpc://h:1"},
			`submit: --actor-engine "grpc://h:1": scheme "grpc": want http or https`},
		{[]string{"submit", "--nats", "nats://127.0.0.1:1", "--rollout", "1", "--sim-tasks", "1", "--planner-engine", "http://", "--actor-engine", ok},
			`--planner-engine "http://": the URL names no host`},
		{[]string{"submit", "--nats", "nats://127.0.0.1:1", "--rollout", "1", "--sim-tasks", "1", "--planner-engine", ok, "--actor-engine", ok, "--protocol", "grpc"},
			`submit: --protocol "grpc": want one of sglang, openai, openai-chat`},
		{[]string{"up", "--demo", "--port", "-1", "--metrics", "", "--planner-url", "localhost:8000", "--actor-url", ok},
			`up: --planner-url "localhost:8000": want an http or https URL`},
		{[]string{"up", "--port", "-1", "--metrics", "", "--actor-url", "127.0.0.1:8001"},
			`up: --actor-url "127.0.0.1:8001": want an http or https URL`},
		{[]string{"up", "--demo", "--port", "-1", "--metrics", "", "--history", "1h", "--result-retention", "1h"},
			`up: --history 1h: the demo's rollouts may run 1h30m (barrier_timeout_s 1800 + rollout_timeout_s 3600): want a longer history`},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var out syncBuffer
		err := run(ctx, c.args, noenv, strings.NewReader(""), &out, &out)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
		if strings.Contains(out.String(), "NATS at") || strings.Contains(out.String(), "waiting for") {
			t.Errorf("%v did something before refusing its flags:\n%s", c.args, out.String())
		}
	}
}

// TestSubmitRefusedRoleEndsTheOther: when planact refuses one role's
// arrival (here the planner's tasks), submit cancels the other's, which
// would wait for its partner until the barrier's time-out, and says so.
func TestSubmitRefusedRoleEndsTheOther(t *testing.T) {
	ctx, url, planner, actor := servedStack(t)
	// One group, two labels: the session-store refuses the planner's
	// arrival, which alone brings the tasks.
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(tasks, []byte(`{"prompt":"a?","label":"1","group_index":0}`+"\n"+`{"prompt":"b?","label":"2","group_index":0}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut syncBuffer
	err := run(ctx, []string{"submit", "--nats", url, "--rollout", "4", "--planner-engine", planner, "--actor-engine", actor,
		"--tasks", tasks, "--timeout", "1m"}, noenv, nil, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "planner: ") || !strings.Contains(err.Error(), "group_index 0") {
		t.Fatalf("submit: %v, want the planner's refusal\n%s%s", err, out.String(), errOut.String())
	}
	if !strings.Contains(err.Error(), "actor: not played: the planner's arrival was refused; its arrival is cancelled") {
		t.Errorf("submit: %v, want it to say what became of the actor", err)
	}
	// The actor's arrival no longer waits at the barrier: it has a result.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Result(ctx, 4, schema.RoleActor)
	if res == nil || res.Status != schema.ResultAborted {
		t.Fatalf("actor's result: %+v, %v; want it aborted (cancelled)", res, err)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test ran out of time")
	}
}
