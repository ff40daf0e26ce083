package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// NatsCLIVersion is the nats CLI the suite runs (make tools installs it).
const NatsCLIVersion = "v0.5.1"

var (
	cliOnce         sync.Once
	cliPath, cliDir string // the nats CLI, and a directory with the planact binary
	cliErr          error
)

// natsCLI returns the real nats CLI, installing it with go install when it
// is neither on PATH nor in $(go env GOPATH)/bin, and a PATH on which
// `planact` is this tree's build (for --translate 'planact decode').
func natsCLI(t *testing.T) (cli string, path string) {
	t.Helper()
	cliOnce.Do(func() {
		cliPath, cliErr = findNatsCLI()
		if cliErr != nil {
			return
		}
		cliDir, cliErr = os.MkdirTemp("", "planact-cli-")
		if cliErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(cliDir, "planact"), "../cmd/planact").CombinedOutput()
		if err != nil {
			cliErr = fmt.Errorf("build planact: %v\n%s", err, out)
		}
	})
	if cliErr != nil {
		t.Skipf("the nats CLI cannot be had here (%v); `make tools` installs it: go install github.com/nats-io/natscli/nats@%s", cliErr, NatsCLIVersion)
	}
	return cliPath, cliDir + string(os.PathListSeparator) + os.Getenv("PATH")
}

func findNatsCLI() (string, error) {
	if p, err := exec.LookPath("nats"); err == nil {
		return p, nil
	}
	gopath, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(strings.TrimSpace(string(gopath)), "bin", "nats")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if out, err := exec.Command("go", "install", "github.com/nats-io/natscli/nats@"+NatsCLIVersion).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install: %v: %s", err, out)
	}
	return bin, nil
}

// natsRun runs the CLI against url and returns its output.
func natsRun(t *testing.T, url string, args ...string) string {
	t.Helper()
	cli, path := natsCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, append([]string{"--server", url}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+path, "NATS_CONTEXT=", "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nats %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestNatsCLI runs what the README promises with the real nats CLI: the
// services in `nats micro ls`, their consumers and endpoints in `nats micro
// info`, statistics of their real work in `nats micro stats` (the
// actor-gateway's generations took milliseconds and reported one
// microsecond; consumers did not appear at all), readable traffic with
// `nats sub --translate 'planact decode'`, the buckets in `nats kv ls`, and
// `nats trace` of a planact subject.
func TestNatsCLI(t *testing.T) {
	t.Parallel()
	natsCLI(t)
	e := start(t, envOptions{planner: sim.Config{Seed: 91}, actor: sim.Config{Seed: 92, TTFT: 5 * time.Millisecond}})
	waitServices(t, bustest.Conn(t, e.url))

	// A live follower of the plan traffic, decoded by planact.
	followed := natsSub(t, e.url, 4, "plan.901.>")

	tasks := e.tasks(2, 1, 901)
	o := e.rollout(t, e.trainer(t), e.trainer(t), 901, tasks, nil, false)
	if o.perr != nil || o.aerr != nil {
		t.Fatal(o.perr, o.aerr)
	}
	// Which plan messages it sees depends on when the server took its
	// subscription (the CLI says "Subscribing" before): any one, decoded.
	if got := followed(); !strings.Contains(got, `"schema": "plan.`) || !strings.Contains(got, `"rollout": 901`) {
		t.Errorf("nats sub --translate 'planact decode' printed no decoded plan message:\n%s", got)
	}

	// nats micro ls: the five services. The CLI lists the answers to its
	// ping that come within its window: on a loaded machine a service may
	// answer after it, so the listing is asked for again (a service that
	// never answers is missing from every one).
	services := []string{"session-store", "planner-gateway", "plan-parser", "act-dispatcher", "actor-gateway"}
	var names []string
	for try := 0; try < 10; try++ {
		var list []struct {
			Name string `json:"name"`
			ID   string `json:"id"`
		}
		mustJSON(t, natsRun(t, e.url, "micro", "ls", "--json"), &list)
		names = names[:0]
		for _, s := range list {
			names = append(names, s.Name)
		}
		if !slices.ContainsFunc(services, func(s string) bool { return !slices.Contains(names, s) }) {
			break
		}
	}
	for _, want := range services {
		if !slices.Contains(names, want) {
			t.Errorf("nats micro ls, asked 10 times: no %s in %v", want, names)
		}
	}

	// nats micro info: the act-dispatcher's consumers are its endpoints.
	var info struct {
		Info struct {
			Endpoints []struct {
				Name    string `json:"name"`
				Subject string `json:"subject"`
			} `json:"endpoints"`
		} `json:"info"`
	}
	mustJSON(t, natsRun(t, e.url, "micro", "info", "act-dispatcher", "--json"), &info)
	var eps []string
	for _, ep := range info.Info.Endpoints {
		eps = append(eps, ep.Name)
	}
	for _, want := range []string{"act-dispatcher-plan", "status"} {
		if !slices.Contains(eps, want) {
			t.Errorf("nats micro info act-dispatcher: no endpoint %s in %v", want, eps)
		}
	}

	// nats micro stats: the real work, counted and timed.
	acts := o.actor.Stats.Acts
	stat := func(service, endpoint string) (requests, errs int, avg time.Duration) {
		var instances []struct {
			Endpoints []struct {
				Name    string        `json:"name"`
				Num     int           `json:"num_requests"`
				Errors  int           `json:"num_errors"`
				Total   time.Duration `json:"processing_time"`
				Average time.Duration `json:"average_processing_time"`
			} `json:"endpoints"`
		}
		// As with micro ls, an answer after the CLI's window is asked for again.
		for try := 0; try < 10 && len(instances) == 0; try++ {
			mustJSON(t, natsRun(t, e.url, "micro", "stats", service, "--json"), &instances)
		}
		var total time.Duration
		found := false
		for _, st := range instances {
			for _, ep := range st.Endpoints {
				if ep.Name == endpoint {
					requests, errs, total, found = requests+ep.Num, errs+ep.Errors, total+ep.Total, true
				}
			}
		}
		if found {
			if requests > 0 {
				avg = total / time.Duration(requests)
			}
			return requests, errs, avg
		}
		t.Fatalf("nats micro stats %s: no endpoint %s", service, endpoint)
		return
	}
	if n, errs, avg := stat("actor-gateway", "generate"); n != acts || errs != 0 || avg < 5*time.Millisecond {
		t.Errorf("actor-gateway generate: %d requests, %d errors, %v on average; want %d generations of at least the engine's 5ms", n, errs, avg, acts)
	}
	// Every episode's turns: a plan (held while the turn ran) or an answer.
	if n, errs, _ := stat("act-dispatcher", "act-dispatcher-plan"); n < 2*len(tasks) || errs != 0 {
		t.Errorf("act-dispatcher-plan: %d messages, %d errors; want a plan and an answer per episode (%d)", n, errs, 2*len(tasks))
	}
	if n, _, _ := stat("planner-gateway", "planner-gateway"); n < len(tasks) {
		t.Errorf("planner-gateway: %d plan requests for %d episodes", n, len(tasks))
	}

	// nats kv ls: planact's buckets, and the rollout's session in one.
	if out := natsRun(t, e.url, "kv", "ls", "--names"); !strings.Contains(out, "sessions") || !strings.Contains(out, "runs") {
		t.Errorf("nats kv ls: %s", out)
	}
	if out := natsRun(t, e.url, "kv", "ls", "sessions"); !strings.Contains(out, "901") {
		t.Errorf("nats kv ls sessions: no key 901 in\n%s", out)
	}

	// nats trace: a status event, as the README shows it, reaches the
	// ROLLOUT stream.
	out := natsRun(t, e.url, "trace", "rollout.901.status", "x")
	if !strings.Contains(out, "ROLLOUT") {
		t.Errorf("nats trace rollout.901.status: no sign of the ROLLOUT stream in\n%s", out)
	}
}

func mustJSON(t *testing.T, out string, v any) {
	t.Helper()
	start := strings.IndexAny(out, "[{")
	if start < 0 {
		t.Fatalf("no JSON in %q", out)
	}
	if err := json.Unmarshal([]byte(out[start:]), v); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			t.Fatalf("not JSON at %d: %v\n%s", syn.Offset, err, out)
		}
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestNatsCLISpeaksJSON: what a trainer writes may be JSON where its
// Content-Type says so, so the real `nats pub` alone can arrive, be told
// what is wrong, and cancel; a JSON body used to be refused as "msgpack:
// unexpected code=7b decoding map length". Without the header, the answer
// says what planact reads and how to send it.
func TestNatsCLISpeaksJSON(t *testing.T) {
	t.Parallel()
	natsCLI(t)
	e := start(t, envOptions{planner: sim.Config{Seed: 95}, actor: sim.Config{Seed: 96}})
	nc := bustest.Conn(t, e.url)
	c := e.trainer(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	asJSON := []string{"-H", "Content-Type: application/json"}
	arrival := func(n int64, role, url, extra string) string {
		return fmt.Sprintf(`{"schema": "rollout.arrive/1", "rollout": %d, "role": %q, "at_ms": %d.0,
			"engine": {"url": %q, "protocol": "sglang"}, "weight_version": "%s-v1"%s}`, n, role, time.Now().UnixMilli(), url, role, extra)
	}
	rejection := func(n int64, role string) *nats.Subscription {
		sub, err := nc.SubscribeSync(fmt.Sprintf("rollout.%d.result.%s.rejected", n, role))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		return sub
	}
	reason := func(sub *nats.Subscription) string {
		m, err := sub.NextMsg(patience)
		if err != nil {
			t.Fatalf("no rejection: %v", err)
		}
		var r schema.Result
		if err := schema.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		return r.Reason
	}

	// A whole rollout, both arrivals published by the CLI in JSON.
	const n = 905
	tasks, err := json.Marshal(e.tasks(2, 1, n))
	if err != nil {
		t.Fatal(err)
	}
	natsRun(t, e.url, append([]string{"pub", "-J", "rollout.905.arrive.planner",
		arrival(n, "planner", e.planner.URL, `, "tasks": `+string(tasks)+`, "config": {"max_turns": 4.0, "rollout_timeout_s": 120}`)}, asJSON...)...)
	natsRun(t, e.url, append([]string{"pub", "-J", "rollout.905.arrive.actor", arrival(n, "actor", e.actor.URL, "")}, asJSON...)...)
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		res, err := c.Result(ctx, n, role)
		if err != nil || res.Status != schema.ResultOK || len(res.Samples) == 0 {
			bustest.DumpGoroutines(t)
			t.Fatalf("%s: %v %+v, want ok with samples", role, err, res)
		}
	}

	// A wrong type in JSON is named by its path, as in msgpack.
	wrong := rejection(906, "planner")
	natsRun(t, e.url, append([]string{"pub", "-J", "rollout.906.arrive.planner",
		arrival(906, "planner", e.planner.URL, `, "tasks": [{"prompt": "q"}], "config": {"max_turns": "4"}`)}, asJSON...)...)
	if got := reason(wrong); !strings.Contains(got, `config.max_turns is the string "4": want an integer`) {
		t.Errorf("max_turns \"4\" in JSON: %q", got)
	}

	// JSON without its Content-Type: told what planact reads, and how.
	bare := rejection(907, "planner")
	natsRun(t, e.url, "pub", "-J", "rollout.907.arrive.planner", arrival(907, "planner", e.planner.URL, `, "tasks": [{"prompt": "q"}]`))
	if got := reason(bare); !strings.Contains(got, "the body is JSON, and planact reads msgpack") || !strings.Contains(got, "-H 'Content-Type: application/json'") {
		t.Errorf("JSON without its Content-Type: %q", got)
	}

	// A cancel from the command line ends a rollout waiting at the barrier.
	const waiting = 908
	statuses, err := nc.SubscribeSync("rollout.908.status")
	if err != nil {
		t.Fatal(err)
	}
	natsRun(t, e.url, append([]string{"pub", "-J", "rollout.908.arrive.actor", arrival(waiting, "actor", e.actor.URL, "")}, asJSON...)...)
	for arrived := false; !arrived; {
		// The arrival is recorded before the cancel goes: the session-store
		// may take messages in another order than they were published.
		m, err := statuses.NextMsg(patience)
		if err != nil {
			t.Fatalf("the actor's JSON arrival was not recorded: %v", err)
		}
		var st schema.Status
		arrived = schema.Unmarshal(m.Data, &st) == nil && st.Event == "arrived"
	}
	natsRun(t, e.url, append([]string{"pub", "-J", "rollout.908.cancel.actor",
		`{"schema": "rollout.cancel/1", "rollout": 908, "role": "actor", "reason": "from the command line"}`}, asJSON...)...)
	res, err := c.Result(ctx, waiting, schema.RoleActor)
	if err != nil || res.Status != schema.ResultAborted || res.Reason != "aborted by the actor trainer: from the command line" {
		t.Fatalf("cancelled from the CLI: %v %+v", err, res)
	}
}
