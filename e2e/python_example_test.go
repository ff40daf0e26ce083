package e2e

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// python finds a Python 3 with msgpack (Debian's python3-msgpack), or skips
// the test saying what to install.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(p)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import msgpack").Run() == nil {
			return path
		}
	}
	t.Skip("no python3 with msgpack here: apt-get install python3 python3-msgpack (.ci/run does)")
	return ""
}

// TestPythonExampleEncodesWhatGoDecodes: the Python trainer's arrival, as
// it encodes it (msgpack, headers, subject), is what the session-store's
// strict decoder accepts. nats-py cannot be installed here, so the test
// stands in a stub for the nats module; encoding needs none of it.
func TestPythonExampleEncodesWhatGoDecodes(t *testing.T) {
	py := python(t)
	examples, err := filepath.Abs("../examples/python")
	if err != nil {
		t.Fatal(err)
	}
	script := `
import base64, json, sys, types
sys.modules["nats"] = types.ModuleType("nats")
sys.path.insert(0, sys.argv[1])
import trainer
tasks = [{"group_index": 0, "index": i, "prompt": "What is the capital of France?", "label": "Paris",
          "metadata": {"source": "test"}} for i in range(2)]
config = {"max_turns": 3, "actor_sampling": {"temperature": 0.0, "seed": 7},
          "tools": [{"name": "search", "kind": "actor"}]}
subject, headers, body = trainer.arrival_message(7, "planner", {"url": "http://router:30000", "protocol": "sglang"},
                                                 "step-7", tasks, config, at_ms=1767225600000)
print(json.dumps({"subject": subject, "headers": headers, "body": base64.b64encode(body).decode()}))
`
	cmd := exec.Command(py, "-c", script, examples)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	var msg struct {
		Subject string            `json:"subject"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	if err := json.Unmarshal(out, &msg); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	body, err := base64.StdEncoding.DecodeString(msg.Body)
	if err != nil {
		t.Fatal(err)
	}
	var a schema.Arrive
	if err := schema.UnmarshalStrict(body, &a); err != nil {
		t.Fatalf("the Go decoder refuses the Python arrival: %v", err)
	}
	if a.Rollout != 7 || a.Role != schema.RolePlanner || a.Engine.URL != "http://router:30000" || a.WeightVersion != "step-7" ||
		len(a.Tasks) != 2 || a.Tasks[1].Index != 1 || a.Tasks[0].Label != "Paris" || a.Config == nil || a.Config.MaxTurns != 3 ||
		a.Config.ActorSampling.Temperature == nil || *a.Config.ActorSampling.Temperature != 0 || *a.Config.ActorSampling.Seed != 7 {
		t.Errorf("decoded %+v", a)
	}
	if err := a.Config.WithDefaults().Validate(); err != nil {
		t.Errorf("its config: %v", err)
	}
	if msg.Subject != subject.Arrive(7, schema.RolePlanner) {
		t.Errorf("subject %q, want %q", msg.Subject, subject.Arrive(7, schema.RolePlanner))
	}
	h := msg.Headers
	if h[schema.HdrSchema] != a.Kind() || h[schema.HdrRollout] != "7" || h[schema.HdrRole] != schema.RolePlanner ||
		h[schema.HdrContentType] != schema.ContentType || h["Nats-Msg-Id"] != a.MsgID() {
		t.Errorf("headers %v (the Go client would send id %q)", h, a.MsgID())
	}
	if bus.TraceIDOf(h[schema.HdrTraceparent]) != bus.RolloutTraceID(7) {
		t.Errorf("traceparent %q does not carry the rollout's trace id %s", h[schema.HdrTraceparent], bus.RolloutTraceID(7))
	}
}

// TestPythonExamplesCompile: every Python file under examples/ compiles.
func TestPythonExamplesCompile(t *testing.T) {
	py := python(t)
	files, _ := filepath.Glob("../examples/python/*.py")
	if len(files) == 0 {
		t.Fatal("no Python examples")
	}
	for _, f := range files {
		if out, err := exec.Command(py, "-c", "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')", f).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", f, err, strings.TrimSpace(string(out)))
		}
	}
}
