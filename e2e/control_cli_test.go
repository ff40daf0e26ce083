package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/sim"
)

// TestNatsCLIPauseIsAlwaysAnswered: a trainer that writes its own pauses
// and resumes (here the real `nats` CLI, in JSON) is answered for each one.
// A pause or resume the session-store refused (a time-out out of range, a
// body naming another role) used to be given up without a word, and its
// trainer waited on control.<role>.paused for ever; now the refusal comes
// on control.<role>.refused, naming the message's id, what was refused and
// the field at fault with its value. A valid pause is answered on
// control.<role>.paused, a valid resume on control.<role>.resumed.
func TestNatsCLIPauseIsAlwaysAnswered(t *testing.T) {
	t.Parallel()
	natsCLI(t)
	e := start(t, envOptions{planner: sim.Config{Seed: 97}, actor: sim.Config{Seed: 98}})
	waitServices(t, bustest.Conn(t, e.url))
	at := time.Now().UnixMilli()
	// publish sends a control message as a hand-written trainer does,
	// waiting for the stream's acknowledgement, with its own message id.
	publish := func(subj, id, body string) {
		natsRun(t, e.url, "pub", "-J", subj, body, "-H", "Content-Type: application/json", "-H", "Nats-Msg-Id: "+id)
	}

	// Subscribed as docs/async.md shows: to the answer and the refusal.
	refused := natsSub(t, e.url, 2, "control.actor.paused", "control.actor.refused")
	publish("control.actor.pause", "cli-pause-1",
		fmt.Sprintf(`{"schema": "control.pause/1", "role": "actor", "mode": "wait", "timeout_s": -5, "at_ms": %d}`, at))
	publish("control.actor.resume", "cli-resume-1",
		fmt.Sprintf(`{"schema": "control.resume/1", "role": "planner", "weight_version": "v2", "at_ms": %d}`, at))
	out := refused()
	for _, want := range []string{
		`"verb": "pause"`, `"id": "cli-pause-1"`, `"reason": "pause of actor: timeout_s -5: want a number of seconds from 1 to 604800"`,
		`"verb": "resume"`, `"id": "cli-resume-1"`, `the body role planner`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("nats sub control.actor.paused control.actor.refused: no %s in\n%s", want, out)
		}
	}

	paused := natsSub(t, e.url, 1, "control.actor.paused")
	publish("control.actor.pause", "cli-pause-2",
		fmt.Sprintf(`{"schema": "control.pause/1", "role": "actor", "mode": "wait", "timeout_s": 60, "at_ms": %d}`, at+1))
	if out := paused(); !strings.Contains(out, `"pause_id": "cli-pause-2"`) {
		t.Errorf("nats sub control.actor.paused: no answer to cli-pause-2 in\n%s", out)
	}
	resumed := natsSub(t, e.url, 1, "control.actor.resumed")
	publish("control.actor.resume", "cli-resume-2",
		fmt.Sprintf(`{"schema": "control.resume/1", "role": "actor", "weight_version": "actor-v4", "at_ms": %d}`, at+2))
	if out := resumed(); !strings.Contains(out, `"resume_id": "cli-resume-2"`) || !strings.Contains(out, `"weight_version": "actor-v4"`) {
		t.Errorf("nats sub control.actor.resumed: no answer to cli-resume-2 in\n%s", out)
	}
}

// natsSub starts `nats sub <subjects> --count count --translate 'planact
// decode'` and returns, once it says it subscribes, a func that waits for
// it to have printed count messages and returns what it printed. The CLI
// says "Subscribing on" just before it subscribes, and the server has the
// subscription a moment later: a message published at once may come
// before it. The callers here publish with another `nats` process, which
// takes far longer to start; TestNatsCLI counts messages of a whole
// rollout, of which it may miss the first.
func natsSub(t *testing.T, url string, count int, subjects ...string) func() string {
	t.Helper()
	cli, path := natsCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	subj := strings.Join(subjects, " ")
	args := append([]string{"--server", url, "sub"}, subjects...)
	sub := exec.CommandContext(ctx, cli, append(args, "--translate", "planact decode", "--count", fmt.Sprint(count))...)
	sub.Env = append(os.Environ(), "PATH="+path, "NATS_CONTEXT=", "HOME="+t.TempDir())
	stdout, err := sub.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sub.Stderr = sub.Stdout
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	done := make(chan error, 1)
	subscribed := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "Subscribing on") {
				once.Do(func() { close(subscribed) })
			}
		}
		done <- sub.Wait()
	}()
	select {
	case <-subscribed:
	case err := <-done:
		t.Fatalf("nats sub %s ended before it subscribed: %v\n%s", subj, err, out.String())
	}
	return func() string {
		t.Helper()
		if err := <-done; err != nil {
			t.Fatalf("nats sub %s: %v (no answer came)\n%s", subj, err, out.String())
		}
		return out.String()
	}
}
