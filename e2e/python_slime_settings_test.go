package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestPythonSlimeCredsOrPassword: a user and password together with a
// .creds file is two ways to authenticate, one of them left unused without
// a word: an error naming both. Either alone is taken.
func TestPythonSlimeCredsOrPassword(t *testing.T) {
	t.Parallel()
	out, err := slimeRun(t, `
report = {}
def attempt(name, call):
    try:
        report[name] = call()
    except ValueError as e:
        report[name] = f"ValueError: {e}"

creds = {"PLANACT_NATS_CREDS": "/secrets/planner.creds"}
user = {"PLANACT_NATS_USER": "trainer-planner", "PLANACT_NATS_PASSWORD": "s3cret"}
attempt("both", lambda: slime_planact.connect_options({**user, **creds}))
attempt("creds", lambda: slime_planact.connect_options(creds).get("user_credentials"))
attempt("user", lambda: slime_planact.connect_options(user)["user"])
print(json.dumps(report))
`, nil, slimeFeed{})
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]any
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	want := "ValueError: PLANACT_NATS_USER/PLANACT_NATS_PASSWORD and PLANACT_NATS_CREDS are both set"
	if got, _ := r["both"].(string); !strings.HasPrefix(got, want) {
		t.Errorf("a user and password and a .creds file: %q, want %q…", got, want)
	}
	if r["creds"] != "/secrets/planner.creds" || r["user"] != "trainer-planner" {
		t.Errorf("a .creds file alone: %v, a user alone: %v: want each taken", r["creds"], r["user"])
	}
}

// TestPythonSlimePartialCountsGroups: a partial result that leaves the
// delivered groups out (result_samples undelivered) counts only its own
// samples (sample_count); the warning that the role trains on the samples
// that finished counts the groups' too (group_samples), as many as the
// batch holds.
func TestPythonSlimePartialCountsGroups(t *testing.T) {
	t.Parallel()
	const n = 12
	samples := plannerSamples(n)
	groups := byGroup(samples, nil)
	var feed slimeFeed
	for _, g := range []int{10, 11} {
		feed.store(t, subject.Group(n, schema.RolePlanner, g), &schema.Group{Rollout: n, Role: schema.RolePlanner, GroupIndex: g,
			Samples: groups[g], SampleCount: len(groups[g]), Tasks: trained(g), Delivered: []int{10, 11}[:g-9], Groups: 2})
	}
	feed.answer(t, subject.Result(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultPartial,
		Reason: "rollout_timeout_s passed", Tasks: trained(10, 11), DeliveredGroups: []int{10, 11}, GroupSamples: len(samples)})
	out, err := slimeRun(t, `
import logging
said = []
class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
slime_planact.logger.addHandler(Said())
slime_planact.logger.setLevel(logging.INFO)
out = slime_planact.generate_rollout(rollout_args(sys.argv[1]), 12, DataSource(prompt_groups(2)))
print(json.dumps({"said": [s for s in said if "partial" in s], "trained": sum(len(g) for g in out.samples)}))
`, map[string]string{"PLANACT_ROLE": "planner", "PLANACT_CONFIG": `{"stream_groups": true}`}, feed, engineServer(t, "4"))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Said    []string `json:"said"`
		Trained int      `json:"trained"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	want := fmt.Sprintf("rollout %d: partial: rollout_timeout_s passed; training the planner on the %d samples that finished", n, len(samples))
	if r.Trained != len(samples) || len(r.Said) != 1 || r.Said[0] != want {
		t.Errorf("trained on %d samples, warning %q: want %d and %q", r.Trained, r.Said, len(samples), want)
	}
}
