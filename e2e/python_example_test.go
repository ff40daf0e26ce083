package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
	t.Parallel()
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
	takeNonce(t, &a, h["Nats-Msg-Id"])
	if h[schema.HdrSchema] != a.Kind() || h[schema.HdrRollout] != "7" || h[schema.HdrRole] != schema.RolePlanner ||
		h[schema.HdrContentType] != schema.ContentType || h["Nats-Msg-Id"] != a.MsgID() {
		t.Errorf("headers %v (the Go client would send id %q)", h, a.MsgID())
	}
	if bus.TraceIDOf(h[schema.HdrTraceparent]) != bus.RolloutTraceID(7) {
		t.Errorf("traceparent %q does not carry the rollout's trace id %s", h[schema.HdrTraceparent], bus.RolloutTraceID(7))
	}
}

// nonceRE is an arrival id's nonce: 16 lower-case hex digits.
var nonceRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

// takeNonce sets a's Nonce (in the id only, not in the body) to the last
// token of id, the Nats-Msg-Id it came with, checking it is a nonce.
func takeNonce(t *testing.T, a *schema.Arrive, id string) {
	t.Helper()
	nonce := id[strings.LastIndexByte(id, '.')+1:]
	if !nonceRE.MatchString(nonce) {
		t.Errorf("arrival id %q ends in %q: want a nonce of 16 hex digits, as the Go client's", id, nonce)
	}
	a.Nonce = nonce
}

// TestPythonExamplesCompile: every Python file under examples/python (its
// test doubles included) compiles with py_compile, the bytecode written
// outside the tree.
func TestPythonExamplesCompile(t *testing.T) {
	t.Parallel()
	py := python(t)
	var files []string
	err := filepath.WalkDir("../examples/python", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".py") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"trainer.py", "slime_planact.py"} {
		if !slices.Contains(files, filepath.Join("../examples/python", want)) {
			t.Errorf("no examples/python/%s among %v", want, files)
		}
	}
	for _, f := range files {
		cmd := exec.Command(py, "-m", "py_compile", f)
		cmd.Env = append(os.Environ(), "PYTHONPYCACHEPREFIX="+t.TempDir())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", f, err, strings.TrimSpace(string(out)))
		}
	}
}

// The slime rollout module (examples/python/slime_planact.py) runs here
// against test doubles: slime's Sample and RolloutFnTrainOutput with their
// real names (examples/python/testing/slime) and an in-memory nats-py
// (examples/python/testing/nats) holding what planact would have
// published, encoded by Go. Its SGLang engine is an HTTP test server that
// reports a weight version.

// slimeHarness starts every script: the fake NATS is filled from stdin
// (base64 msgpack by subject, and objects), and helpers print slime
// Samples and what the module published as JSON.
const slimeHarness = `
import base64, json, sys, types
import msgpack
import nats
import slime_planact
from slime.utils.types import Sample

feed = json.load(sys.stdin)
for subject, data in feed.get("store") or []:
    nats.store(subject, base64.b64decode(data))
answers = [(subject, base64.b64decode(data)) for subject, data in feed.get("answers") or []]

def answer_arrival(m):
    """planact's answers to the role's arrival, stored when it comes, naming
    it (arrival_id) unless they name another."""
    arrival = m.subject.split(".")
    if len(arrival) != 4 or arrival[0] != "rollout" or arrival[2] != "arrive":
        return
    for subject, data in answers:
        if subject.split(".")[:4] == ["rollout", arrival[1], "result", arrival[3]]:
            r = msgpack.unpackb(data, raw=False)
            r["arrival_id"] = r.get("arrival_id") or m.headers["Nats-Msg-Id"]
            nats.store(subject, msgpack.packb(r, use_bin_type=True))

nats.on_publish.append(answer_arrival)
for bucket, name, data in feed.get("objects") or []:
    nats.objects.setdefault(bucket, {})[name] = base64.b64decode(data)
nats.behind.update(feed.get("behind") or {})
nats.away.update(feed.get("away") or {})

def sample_json(s):
    return {"group_index": s.group_index, "index": s.index, "rollout_id": s.rollout_id, "prompt": s.prompt,
            "tokens": s.tokens, "response": s.response, "response_length": s.response_length,
            "loss_mask": s.loss_mask, "rollout_log_probs": s.rollout_log_probs, "reward": s.reward,
            "status": s.status.name, "weight_versions": s.weight_versions, "label": s.label,
            "metadata": s.metadata, "remove_sample": s.remove_sample}

def published():
    return [{"subject": m.subject, "headers": m.headers, "body": base64.b64encode(m.data).decode()} for m in nats.published]

class DataSource:
    """slime's DataSource (slime/rollout/data_source.py): get_samples, add_samples."""
    def __init__(self, groups):
        self.groups, self.asked, self.added = groups, [], []
    def get_samples(self, num_samples):
        self.asked.append(num_samples)
        return self.groups[:num_samples]
    def add_samples(self, samples):
        self.added.extend(samples)

def prompt_groups(n_groups, first_group=10, prompt=None):
    """n_groups of 2 copies, numbered as slime's RolloutDataSource does."""
    groups = []
    for g in range(n_groups):
        gi = first_group + g
        label = ["Paris", "paris"] if g == 1 else "Paris"  # a label slime keeps as it is, sent as JSON text
        groups.append([Sample(group_index=gi, index=2 * gi + i, prompt=prompt or f"What is the capital of France? ({gi})",
                              label=label, metadata={"source": "hotpot", "row": gi}) for i in range(2)])
    return groups

def rollout_args(engine, batch=2, over=None, **more):
    host, port = engine.removeprefix("http://").rsplit(":", 1)
    return types.SimpleNamespace(**{"rollout_batch_size": batch, "over_sampling_batch_size": over or batch, "n_samples_per_prompt": 2,
                                    "sglang_router_ip": host, "sglang_router_port": int(port), "partial_rollout": False, **more})

def print_rollout(out, ds):
    print(json.dumps({"published": published(), "groups": [[sample_json(s) for s in g] for g in out.samples],
                      "metrics": out.metrics, "asked": ds.asked, "added": [[sample_json(s) for s in g] for g in ds.added],
                      "objects": {b: {n: base64.b64encode(d).decode() for n, d in o.items()} for b, o in nats.objects.items()}}))
`

// slimeFeed is what the fake NATS holds when the script starts, and what
// it answers an arrival with.
type slimeFeed struct {
	Store [][2]string `json:"store"` // subject, base64 msgpack
	// Answers are planact's results and rejections (subject, base64
	// msgpack), stored when the role's arrival comes, naming it in
	// arrival_id unless they name another: a result that names no arrival
	// is not known to answer it, and is passed over, as the Go client does.
	Answers [][2]string `json:"answers,omitempty"`
	Objects [][3]string `json:"objects"` // bucket, name, base64 msgpack
	// Behind and Away: a subject's next direct gets answer 404 (a
	// follower behind), or time out (a server away), that many times.
	Behind map[string]int `json:"behind,omitempty"`
	Away   map[string]int `json:"away,omitempty"`
}

func (f *slimeFeed) store(t *testing.T, subject string, v any) {
	t.Helper()
	f.Store = append(f.Store, [2]string{subject, base64.StdEncoding.EncodeToString(marshal(t, v))})
}

// answer adds v, a result or rejection on subject, to what answers the
// arrival of its rollout and role.
func (f *slimeFeed) answer(t *testing.T, subject string, v *schema.Result) {
	t.Helper()
	f.Answers = append(f.Answers, [2]string{subject, base64.StdEncoding.EncodeToString(marshal(t, v))})
}

// stored is f with its answers stored from the start as they are: for a
// script that reads them without arriving (trainer.accept with no arrival
// id takes an answer that names none).
func (f slimeFeed) stored() slimeFeed {
	f.Store = append(slices.Clone(f.Store), f.Answers...)
	f.Answers = nil
	return f
}

func (f *slimeFeed) object(t *testing.T, bucket, name string, v any) {
	t.Helper()
	f.Objects = append(f.Objects, [3]string{bucket, name, base64.StdEncoding.EncodeToString(marshal(t, v))})
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	data, err := schema.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// slimeRun runs the harness and script with python and argv (sys.argv[1:]),
// env added to the environment less its PLANACT_* variables, and returns
// what it printed on stdout (its log goes to stderr, shown on failure).
func slimeRun(t *testing.T, script string, env map[string]string, feed slimeFeed, argv ...string) ([]byte, error) {
	t.Helper()
	py := python(t)
	examples, err := filepath.Abs("../examples/python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, append([]string{"-c", slimeHarness + script}, argv...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PLANACT_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "PYTHONDONTWRITEBYTECODE=1",
		"PYTHONPATH="+filepath.Join(examples, "testing")+string(os.PathListSeparator)+examples)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	in, err := json.Marshal(feed)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = strings.NewReader(string(in))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	return out, nil
}

// engineServer is an SGLang router and worker in one: GET /workers lists
// itself, GET /get_weight_version says version.
func engineServer(t *testing.T, version string) string {
	t.Helper()
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/workers":
			_ = json.NewEncoder(w).Encode(map[string]any{"workers": []map[string]string{{"url": srv.URL}}})
		case "/get_weight_version":
			_ = json.NewEncoder(w).Encode(map[string]string{"weight_version": version})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// pyRollout is what print_rollout prints.
type pyRollout struct {
	Published []pyMsg                      `json:"published"`
	Groups    [][]pySample                 `json:"groups"`
	Metrics   map[string]float64           `json:"metrics"`
	Asked     []int                        `json:"asked"`
	Added     [][]pySample                 `json:"added"`
	Objects   map[string]map[string]string `json:"objects"`
}

type pyMsg struct {
	Subject string            `json:"subject"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

func (m pyMsg) body(t *testing.T) []byte {
	t.Helper()
	data, err := base64.StdEncoding.DecodeString(m.Body)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

type pySample struct {
	GroupIndex      int            `json:"group_index"`
	Index           int            `json:"index"`
	RolloutID       *int           `json:"rollout_id"`
	Prompt          string         `json:"prompt"`
	Tokens          []int          `json:"tokens"`
	Response        string         `json:"response"`
	ResponseLength  int            `json:"response_length"`
	LossMask        []int          `json:"loss_mask"`
	RolloutLogProbs []float64      `json:"rollout_log_probs"`
	Reward          float64        `json:"reward"`
	Status          string         `json:"status"`
	WeightVersions  []string       `json:"weight_versions"`
	Label           any            `json:"label"`
	Metadata        map[string]any `json:"metadata"`
	RemoveSample    bool           `json:"remove_sample"`
}

func decodeRollout(t *testing.T, out []byte) pyRollout {
	t.Helper()
	var r pyRollout
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	return r
}

// checkSample: got is want as a slime Sample, token for token.
func checkSample(t *testing.T, got pySample, want schema.Sample, role string) {
	t.Helper()
	where := fmt.Sprintf("%s sample %s (group %d, index %d)", role, want.RolloutID, want.GroupIndex, want.Index)
	if got.GroupIndex != want.GroupIndex || got.Index != want.Index {
		t.Errorf("%s: came as group %d index %d", where, got.GroupIndex, got.Index)
	}
	if !slices.Equal(got.Tokens, want.Tokens) || got.ResponseLength != want.ResponseLength ||
		!slices.Equal(got.LossMask, want.LossMask) && len(got.LossMask)+len(want.LossMask) > 0 {
		t.Errorf("%s: tokens %v, response_length %d, loss_mask %v; want %v, %d, %v",
			where, got.Tokens, got.ResponseLength, got.LossMask, want.Tokens, want.ResponseLength, want.LossMask)
	}
	// planact leaves an empty list out: a response of no tokens has all its
	// log-probs, [] (slime takes a batch's log-probs from its first sample).
	if len(want.RolloutLogProbs) == 0 && want.ResponseLength > 0 && got.RolloutLogProbs != nil ||
		want.ResponseLength == 0 && got.RolloutLogProbs == nil || !slices.Equal(got.RolloutLogProbs, want.RolloutLogProbs) {
		t.Errorf("%s: rollout_log_probs %s, want %v (None when planact has none, [] for no response)", where, pyList(got.RolloutLogProbs), want.RolloutLogProbs)
	}
	if got.Reward != want.Reward || got.Prompt != want.Prompt || got.Response != want.Response ||
		!slices.Equal(got.WeightVersions, want.WeightVersions) && len(got.WeightVersions)+len(want.WeightVersions) > 0 {
		t.Errorf("%s: reward %v, prompt %q, response %q, weight_versions %v; want %v, %q, %q, %v",
			where, got.Reward, got.Prompt, got.Response, got.WeightVersions, want.Reward, want.Prompt, want.Response, want.WeightVersions)
	}
	if got.Status != strings.ToUpper(want.Status) {
		t.Errorf("%s: status %s, want Sample.Status.%s", where, got.Status, strings.ToUpper(want.Status))
	}
	if got.RolloutID == nil {
		t.Errorf("%s: no rollout_id", where)
	}
	if got.Metadata["planact_rollout_id"] != want.RolloutID || got.Metadata["planact_role"] != role {
		t.Errorf("%s: metadata %v does not name its planact rollout id and role", where, got.Metadata)
	}
	for k, v := range want.Metadata {
		w, _ := json.Marshal(v)
		g, _ := json.Marshal(got.Metadata[k])
		if string(w) != string(g) {
			t.Errorf("%s: metadata %s = %s, want %s", where, k, g, w)
		}
	}
}

// checkBatch: batch holds want's samples grouped by group_index, in group
// and index order, and the samples of one episode (planact rollout_id), and
// only those, share a slime rollout_id.
func checkBatch(t *testing.T, batch [][]pySample, want map[int][]schema.Sample, role string) {
	t.Helper()
	gis := slices.Sorted(maps.Keys(want))
	if len(batch) != len(gis) {
		t.Fatalf("%d groups, want %d (groups %v)", len(batch), len(gis), gis)
	}
	episodeOf := map[int]string{}
	for i, gi := range gis {
		if len(batch[i]) != len(want[gi]) {
			t.Errorf("group %d: %d samples, want %d", gi, len(batch[i]), len(want[gi]))
			continue
		}
		for j, w := range want[gi] {
			got := batch[i][j]
			checkSample(t, got, w, role)
			if got.RolloutID == nil {
				continue
			}
			if e, ok := episodeOf[*got.RolloutID]; ok && e != w.RolloutID {
				t.Errorf("episodes %s and %s share slime rollout_id %d", e, w.RolloutID, *got.RolloutID)
			}
			episodeOf[*got.RolloutID] = w.RolloutID
		}
	}
	if ids := slices.Collect(maps.Values(episodeOf)); len(ids) != len(slices.Compact(slices.Sorted(slices.Values(ids)))) {
		t.Errorf("an episode has two slime rollout_ids: %v", episodeOf)
	}
}

// plannerSamples are one planner sample per task of groups 10 and 11: a
// multi-turn one (two generated turns around an observation planact
// appended, loss mask 0 there), a truncated one, a stale one, a failed
// one with no response.
func plannerSamples(n int64) []schema.Sample {
	prompt := []int{101, 102, 103, 104, 105}
	ep := func(e int) string { return fmt.Sprintf("%d-%d", n, e) }
	return []schema.Sample{
		{GroupIndex: 11, Index: 22, RolloutID: ep(2), Prompt: "Plan: capital? (11)", Tokens: []int{101, 102, 103, 104, 105, 9, 8},
			Response: "[search(France)]", ResponseLength: 2, LossMask: []int{1, 1}, RolloutLogProbs: []float64{-0.75, -0.0625},
			Reward: 0.5, Status: schema.EpisodeCompleted, WeightVersions: []string{"1"}, Label: `["Paris", "paris"]`,
			Metadata: map[string]any{"rollout": n, "episode": 2, "turns": 1, "staleness": int64(3), "stale": true}},
		{GroupIndex: 10, Index: 20, RolloutID: ep(0), Prompt: "Plan: capital? (10)",
			Tokens:   append(slices.Clone(prompt), 7, 8, 9, 50, 51, 10, 11),
			Response: "[search(France)]\nObservation: Paris\nAnswer: Paris", ResponseLength: 7,
			LossMask:        []int{1, 1, 1, 0, 0, 1, 1},
			RolloutLogProbs: []float64{-0.1, -0.2, -0.30000000000000004, 0, 0, -0.4, -1e-9},
			Reward:          1, Status: schema.EpisodeCompleted, WeightVersions: []string{"3", "4"}, Label: "Paris",
			Metadata: map[string]any{"rollout": n, "episode": 0, "turns": 2, "answers": 1, "staleness": int64(1), "finish_reason": "stop"}},
		{GroupIndex: 11, Index: 23, RolloutID: ep(3), Prompt: "Plan: capital? (11)", Tokens: slices.Clone(prompt),
			Status: schema.EpisodeFailed, Label: `["Paris", "paris"]`, Metadata: map[string]any{"rollout": n, "episode": 3, "end_reason": "engine down"}},
		{GroupIndex: 10, Index: 21, RolloutID: ep(1), Prompt: "Plan: capital? (10)", Tokens: append(slices.Clone(prompt), 12, 13, 14),
			Response: "[search(Fr", ResponseLength: 3, LossMask: []int{1, 1, 1}, RolloutLogProbs: []float64{-2, -1.5, -0.125},
			Status: schema.EpisodeTruncated, WeightVersions: []string{"4"}, Label: "Paris",
			Metadata: map[string]any{"rollout": n, "episode": 1, "finish_reason": "length"}},
	}
}

func byGroup(samples []schema.Sample, keep func(schema.Sample) bool) map[int][]schema.Sample {
	out := map[int][]schema.Sample{}
	for _, s := range samples {
		if keep == nil || keep(s) {
			out[s.GroupIndex] = append(out[s.GroupIndex], s)
		}
	}
	for _, g := range out {
		slices.SortStableFunc(g, func(a, b schema.Sample) int { return a.Index - b.Index })
	}
	return out
}

func trained(groups ...int) []schema.TaskOutcome {
	var out []schema.TaskOutcome
	for _, g := range groups {
		for i := range 2 {
			out = append(out, schema.TaskOutcome{Episode: len(out), GroupIndex: g, Index: 2*g + i, State: schema.TaskTrained})
		}
	}
	return out
}

// TestPythonSlimePlannerRollout: the planner's slime job reads its batch
// from the data source, arrives with it as planact's strict decoder wants
// it (tasks, config, the engine's weight version, the rollout offset), and
// turns planact's result into slime Samples token for token, one list per
// group, the stale sample kept (the default) and marked.
func TestPythonSlimePlannerRollout(t *testing.T) {
	t.Parallel()
	const n = 107 // PLANACT_ROLLOUT_OFFSET 100 + slime's rollout 7
	samples := plannerSamples(n)
	var feed slimeFeed
	feed.answer(t, subject.Result(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK,
		Samples: samples, SampleCount: len(samples), Tasks: trained(10, 11),
		Stats: schema.Stats{Episodes: 4, Completed: 4, Accuracy: 0.5, MeanReward: 0.375, MeanTurns: 1.5, WallMs: 1500}})
	engine := engineServer(t, "4")
	out, err := slimeRun(t, `
ds = DataSource(prompt_groups(2))
print_rollout(slime_planact.generate_rollout(rollout_args(sys.argv[1]), 7, ds), ds)
`, map[string]string{
		"PLANACT_ROLE": "planner", "PLANACT_ROLLOUT_OFFSET": "100", "PLANACT_ENGINE_URL": "",
		"PLANACT_CONFIG": `{"max_turns": 3, "max_staleness": 2, "actor_sampling": {"temperature": 0.7}}`,
	}, feed, engine)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeRollout(t, out)
	if !slices.Equal(r.Asked, []int{2}) {
		t.Errorf("asked the data source for %v groups, want [2] (--rollout-batch-size)", r.Asked)
	}
	if len(r.Published) != 1 {
		t.Fatalf("published %d messages, want the arrival", len(r.Published))
	}
	arrival := r.Published[0]
	var a schema.Arrive
	if err := schema.UnmarshalStrict(arrival.body(t), &a); err != nil {
		t.Fatalf("the Go decoder refuses the slime module's arrival: %v", err)
	}
	if arrival.Subject != subject.Arrive(n, schema.RolePlanner) || a.Rollout != n || a.Role != schema.RolePlanner {
		t.Errorf("arrival on %s for rollout %d as %s", arrival.Subject, a.Rollout, a.Role)
	}
	if a.Engine.URL != engine || a.Engine.Protocol != "sglang" || a.WeightVersion != "4" {
		t.Errorf("engine %+v, weight version %q: want slime's router %s, sglang, the engine's version 4", a.Engine, a.WeightVersion, engine)
	}
	var wantTasks []schema.Task
	for gi := 10; gi <= 11; gi++ {
		label := "Paris"
		if gi == 11 {
			label = `["Paris", "paris"]`
		}
		for i := range 2 {
			wantTasks = append(wantTasks, schema.Task{GroupIndex: gi, Index: 2*gi + i, Prompt: fmt.Sprintf("What is the capital of France? (%d)", gi),
				Label: label, Metadata: map[string]any{"source": "hotpot", "row": gi}})
		}
	}
	if got, want := jsonOf(t, a.Tasks), jsonOf(t, wantTasks); got != want {
		t.Errorf("tasks\n %s\nwant\n %s", got, want)
	}
	if a.Config == nil || a.Config.MaxTurns != 3 || a.Config.MaxStaleness != 2 || a.Config.ActorSampling.Temperature == nil ||
		*a.Config.ActorSampling.Temperature != 0.7 || a.Config.TargetGroups != 0 {
		t.Errorf("config %+v", a.Config)
	} else if err := a.Config.WithDefaults().Validate(); err != nil {
		t.Errorf("its config: %v", err)
	}
	h := arrival.Headers
	takeNonce(t, &a, h["Nats-Msg-Id"])
	if h[schema.HdrSchema] != a.Kind() || h[schema.HdrRollout] != "107" || h["Nats-Msg-Id"] != a.MsgID() ||
		bus.TraceIDOf(h[schema.HdrTraceparent]) != bus.RolloutTraceID(n) {
		t.Errorf("headers %v (the Go client would send id %q)", h, a.MsgID())
	}
	checkBatch(t, r.Groups, byGroup(samples, nil), schema.RolePlanner)
	for _, g := range r.Groups {
		for _, s := range g {
			// a planner sample starts from its task's Sample: the dataset's
			// label (a list here) and metadata are kept
			if s.Metadata["source"] != "hotpot" || fmt.Sprint(s.Label) != map[bool]string{true: "[Paris paris]", false: "Paris"}[s.GroupIndex == 11] {
				t.Errorf("sample %d: label %v, metadata %v: the data source's are lost", s.Index, s.Label, s.Metadata)
			}
			if stale := s.Metadata["stale"] == true; stale != (s.Index == 22) || s.RemoveSample {
				t.Errorf("sample %d: stale %v, remove_sample %v: only 22 is stale, and kept as it is", s.Index, stale, s.RemoveSample)
			}
		}
	}
	want := map[string]float64{"planact/tasks_trained": 4, "planact/samples": 4, "planact/stale_samples": 1, "planact/stale_dropped": 0,
		"planact/accuracy": 0.5, "planact/mean_reward": 0.375, "planact/wall_s": 1.5}
	for k, v := range want {
		if got, ok := r.Metrics[k]; !ok || got != v {
			t.Errorf("metric %s = %v, want %v (metrics %v)", k, got, v, r.Metrics)
		}
	}
}

// actorSamples are the actor's samples of groups 0 and 2 of rollout n: one
// per act, two acts of episode 0, one of episode 1 (group 0); in group 2
// one of episode 4 and a stale one of episode 5.
func actorSamples(n int64) []schema.Sample {
	act := func(g, index, e int, key string, tokens []int, prompt int, lp []float64, status string, meta map[string]any) schema.Sample {
		m := map[string]any{"rollout": n, "episode": e, "turn": 1, "key": key, "tool": "search"}
		maps.Copy(m, meta)
		return schema.Sample{GroupIndex: g, Index: index, RolloutID: fmt.Sprintf("%d-%d", n, e), Prompt: "Act: " + key, Tokens: tokens,
			Response: "result of " + key, ResponseLength: len(tokens) - prompt, LossMask: slices.Repeat([]int{1}, len(tokens)-prompt),
			RolloutLogProbs: lp, Reward: 1, Status: status, WeightVersions: []string{"6"}, Label: "Paris", Metadata: m}
	}
	return []schema.Sample{
		act(0, 0, 0, "t1-s1", []int{1, 2, 3, 30, 31}, 3, []float64{-0.5, -0.25}, schema.EpisodeCompleted, nil),
		act(0, 0, 0, "t1-s2", []int{1, 2, 4, 32}, 3, []float64{-1}, schema.EpisodeTruncated, nil),
		act(0, 1, 1, "t1-s1", []int{1, 2, 3, 33, 34, 35}, 3, []float64{-0.5, -0.5, -0.5}, schema.EpisodeCompleted, nil),
		act(2, 4, 4, "t1-s1", []int{5, 6, 36}, 2, []float64{-3}, schema.EpisodeCompleted, nil),
		act(2, 5, 5, "t1-s1", []int{5, 6, 37}, 2, []float64{-4}, schema.EpisodeCompleted, map[string]any{"stale": true, "staleness": int64(4)}),
	}
}

// TestPythonSlimeActorGroups: the actor's slime job, with a config that
// streams groups (a filter and target_groups), reads the groups as planact
// delivers them: one listed by the last group message, one found from the
// result's tasks (its message came out of order), its samples in the
// object store; the result's own samples object holds them again, and
// none is taken twice. It arrives without tasks or config, leaves its data source
// alone, drops the stale sample (PLANACT_STALE=drop, counted), and the
// acts of one episode share one slime rollout_id.
func TestPythonSlimeActorGroups(t *testing.T) {
	t.Parallel()
	const n = 8
	samples := actorSamples(n)
	groupSamples := byGroup(samples, nil)
	tasks := trained(0, 2)
	for _, g := range []int{1, 3} {
		state, reason := schema.TaskFiltered, "all rewards equal"
		if g == 3 {
			state, reason = schema.TaskAborted, "stopped: enough groups"
		}
		for i := range 2 {
			tasks = append(tasks, schema.TaskOutcome{Episode: len(tasks), GroupIndex: g, Index: 2*g + i, State: state, Reason: reason})
		}
	}
	var feed slimeFeed
	// Group 0 was decided after group 2 but published before it: the last
	// group message (group 2's) does not list it; the result names it.
	feed.store(t, subject.Group(n, schema.RoleActor, 0), &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: 0,
		Samples: groupSamples[0], SampleCount: 3, Tasks: tasks[0:2], Delivered: []int{2, 0}, Groups: 4})
	object := fmt.Sprintf("rollout-%d-actor.group-2.samples", n)
	feed.object(t, bus.ObjectResults(schema.RoleActor), object, groupSamples[2])
	feed.store(t, subject.Group(n, schema.RoleActor, 2), &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: 2,
		SamplesObject: object, SampleCount: 2, Tasks: tasks[2:4], Delivered: []int{2}, Groups: 4})
	// The result holds every delivered group's samples again, in its
	// object. Group 3's tasks were aborted, and an aborted episode that
	// ended may leave samples there: the module reads it, and takes none
	// of the groups' samples twice.
	resultObject := fmt.Sprintf("rollout-%d-actor.samples", n)
	feed.object(t, bus.ObjectResults(schema.RoleActor), resultObject, samples)
	feed.answer(t, subject.Result(n, schema.RoleActor), &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK,
		SamplesObject: resultObject, SampleCount: len(samples), Tasks: tasks, Stats: schema.Stats{Episodes: 8, Completed: 6, Acts: 5}})
	engine := engineServer(t, "step-6")
	out, err := slimeRun(t, `
ds = DataSource(prompt_groups(2))
print_rollout(slime_planact.generate_rollout(rollout_args("http://slime-router:30000"), 8, ds), ds)
`, map[string]string{
		"PLANACT_ROLE": "actor", "PLANACT_STALE": "drop", "PLANACT_ENGINE_URL": engine,
		"PLANACT_CONFIG": `{"group_filter": "spread", "target_groups": 2}`,
	}, feed)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeRollout(t, out)
	if len(r.Asked) != 0 {
		t.Errorf("the actor asked its data source for %v groups: the planner's job brings the batch", r.Asked)
	}
	if len(r.Published) != 1 {
		t.Fatalf("published %d messages, want the arrival", len(r.Published))
	}
	var a schema.Arrive
	if err := schema.UnmarshalStrict(r.Published[0].body(t), &a); err != nil {
		t.Fatalf("the Go decoder refuses the actor's arrival: %v", err)
	}
	if a.Role != schema.RoleActor || a.Rollout != n || len(a.Tasks) != 0 || a.TasksObject != "" || a.Config != nil ||
		a.Engine.URL != engine || a.WeightVersion != "step-6" {
		t.Errorf("actor arrival %+v: want no tasks, no config, PLANACT_ENGINE_URL %s and its version step-6", a, engine)
	}
	checkBatch(t, r.Groups, byGroup(samples, func(s schema.Sample) bool { return s.Metadata["stale"] != true }), schema.RoleActor)
	want := map[string]float64{"planact/groups_delivered": 2, "planact/stale_samples": 1, "planact/stale_dropped": 1,
		"planact/tasks_trained": 4, "planact/tasks_filtered": 2, "planact/tasks_aborted": 2, "planact/acts": 5}
	for k, v := range want {
		if got, ok := r.Metrics[k]; !ok || got != v {
			t.Errorf("metric %s = %v, want %v (metrics %v)", k, got, v, r.Metrics)
		}
	}
}

// TestPythonSlimeReadsNoSampleTwice: when every task that may have
// samples lies in the groups the module took as they came, the result's
// samples object (every delivered group's samples again) is not read at
// all. Here it is not even stored: a module that read it fails.
func TestPythonSlimeReadsNoSampleTwice(t *testing.T) {
	t.Parallel()
	const n = 10
	samples := actorSamples(n)
	groupSamples := byGroup(samples, nil)
	tasks := trained(0, 2)
	var feed slimeFeed
	var all []schema.Sample
	for i, g := range []int{0, 2} {
		feed.store(t, subject.Group(n, schema.RoleActor, g), &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: g,
			Samples: groupSamples[g], SampleCount: len(groupSamples[g]), Tasks: tasks[2*i : 2*i+2], Delivered: []int{0, 2}[:i+1], Groups: 2})
		all = append(all, groupSamples[g]...)
	}
	feed.answer(t, subject.Result(n, schema.RoleActor), &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK,
		SamplesObject: fmt.Sprintf("rollout-%d-actor.samples", n), SampleCount: len(all), Tasks: tasks, Stats: schema.Stats{Episodes: 4, Completed: 4}})
	out, err := slimeRun(t, `
ds = DataSource(prompt_groups(2))
print_rollout(slime_planact.generate_rollout(rollout_args("http://slime-router:30000"), 10, ds), ds)
`, map[string]string{"PLANACT_ROLE": "actor", "PLANACT_ENGINE_URL": engineServer(t, "step-6"), "PLANACT_CONFIG": `{"stream_groups": true}`}, feed)
	if err != nil {
		t.Fatal(err)
	}
	checkBatch(t, decodeRollout(t, out).Groups, byGroup(all, nil), schema.RoleActor)
}

// TestPythonReadsGroupsBehind: a result that leaves the delivered groups
// out (result_samples undelivered) names them, and both Python readers
// (slime_planact's wait_groups, trainer.py's accept) read each one, trying
// again while a follower behind answers 404 or the server does not answer,
// as the Go and Node clients do. A group never there by the deadline, or
// groups that hold other than the result's group_samples, is an error
// that says so; nothing is trained on short.
func TestPythonReadsGroupsBehind(t *testing.T) {
	t.Parallel()
	const n = 10
	samples := actorSamples(n)
	groupSamples := byGroup(samples, nil)
	tasks := trained(0, 2)
	feed := func(counted int) slimeFeed {
		var f slimeFeed
		for i, g := range []int{0, 2} {
			f.store(t, subject.Group(n, schema.RoleActor, g), &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: g,
				Samples: groupSamples[g], SampleCount: len(groupSamples[g]), Tasks: tasks[2*i : 2*i+2], Delivered: []int{0, 2}[:i+1], Groups: 2})
		}
		f.answer(t, subject.Result(n, schema.RoleActor), &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK,
			Tasks: tasks, DeliveredGroups: []int{0, 2}, GroupSamples: counted, Stats: schema.Stats{Episodes: 4, Completed: 4}})
		// The follower has none of the groups yet: the stream's last group
		// is not found, group 0 twice more, and group 2 times out twice.
		f.Behind = map[string]int{fmt.Sprintf("rollout.%d.result.actor.group.*", n): 1 << 20, subject.Group(n, schema.RoleActor, 0): 2}
		f.Away = map[string]int{subject.Group(n, schema.RoleActor, 2): 2}
		return f
	}
	slime := `
ds = DataSource(prompt_groups(2))
print_rollout(slime_planact.generate_rollout(rollout_args("http://slime-router:30000"), 10, ds), ds)
`
	env := func(timeout string) map[string]string {
		return map[string]string{"PLANACT_ROLE": "actor", "PLANACT_ENGINE_URL": engineServer(t, "step-6"),
			"PLANACT_CONFIG": `{"stream_groups": true}`, "PLANACT_TIMEOUT_S": timeout}
	}
	t.Run("slime", func(t *testing.T) {
		out, err := slimeRun(t, slime, env("30"), feed(len(samples)))
		if err != nil {
			t.Fatal(err)
		}
		checkBatch(t, decodeRollout(t, out).Groups, groupSamples, schema.RoleActor)
	})
	t.Run("trainer", func(t *testing.T) {
		out, err := slimeRun(t, `
import asyncio, trainer
async def main():
    nc = await nats.connect()
    r = await trainer.accept(nc, "actor", await trainer.last_on(nc, sys.argv[1]), "", deadline=time.monotonic() + 30)
    print(json.dumps({"samples": [[s.get("group_index", 0), s.get("index", 0)] for s in r["samples"]], "asked": nats.asked}))
import time
asyncio.run(main())
`, nil, feed(len(samples)).stored(), subject.Result(n, schema.RoleActor))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Samples [][2]int       `json:"samples"`
			Asked   map[string]int `json:"asked"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("python printed %q: %v", out, err)
		}
		var want [][2]int
		for _, s := range samples {
			want = append(want, [2]int{s.GroupIndex, s.Index})
		}
		if !slices.Equal(got.Samples, want) {
			t.Errorf("samples (group, index) %v, want %v", got.Samples, want)
		}
		for _, g := range []int{0, 2} {
			if a := got.Asked[subject.Group(n, schema.RoleActor, g)]; a != 3 {
				t.Errorf("group %d read %d times, want 3 (two unanswered or not found, then found)", g, a)
			}
		}
	})
	t.Run("never there", func(t *testing.T) {
		f := feed(len(samples))
		f.Behind[subject.Group(n, schema.RoleActor, 2)] = 1 << 20
		_, err := slimeRun(t, slime, env("1"), f)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("PlanactError: planact: unreadable: rollout %d (actor): group 2 of rollout %d, named delivered", n, n)) ||
			!strings.Contains(err.Error(), "nothing there") {
			t.Errorf("a group never there: %v, want PlanactError unreadable naming group 2", err)
		}
	})
	t.Run("counts differ", func(t *testing.T) {
		_, err := slimeRun(t, slime, env("30"), feed(len(samples)+1))
		want := fmt.Sprintf("hold %d samples, the result counts %d (group_samples)", len(samples), len(samples)+1)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("groups short of group_samples: %v, want an error saying %q", err, want)
		}
	})
}

// TestPythonSlimeOverSampling: slime's over-sampling flags in planact's
// terms. The planner sends --over-sampling-batch-size groups (3) with
// target_groups --rollout-batch-size (2); a batch too large for a message
// goes to the object store tasks, as a task list the Go decoder accepts;
// with --partial-rollout the group planact stopped goes back to the data
// source, unchanged. PLANACT_STALE=mask keeps the stale sample in its group
// with remove_sample set. It asks for results without the delivered
// groups' samples, and reads them from the groups; and since the config it
// sent streams the groups (target_groups), though PLANACT_CONFIG does not,
// it reads them as they come and counts them (planact/groups_delivered).
func TestPythonSlimeOverSampling(t *testing.T) {
	t.Parallel()
	const n = 9
	samples := plannerSamples(n)
	var feed slimeFeed
	for _, g := range []int{10, 11} {
		feed.store(t, subject.Group(n, schema.RolePlanner, g), &schema.Group{Rollout: n, Role: schema.RolePlanner, GroupIndex: g,
			Samples: byGroup(samples, nil)[g], SampleCount: len(byGroup(samples, nil)[g]), Tasks: trained(g), Delivered: []int{10, 11}[:g-9], Groups: 3})
	}
	tasks := append(trained(10, 11), schema.TaskOutcome{Episode: 4, GroupIndex: 12, Index: 24, State: schema.TaskAborted},
		schema.TaskOutcome{Episode: 5, GroupIndex: 12, Index: 25, State: schema.TaskUnfinished})
	// The module asks for results without the groups' samples
	// (result_samples undelivered): the result names the groups, and the
	// module reads their samples from their messages.
	feed.answer(t, subject.Result(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK,
		Tasks: tasks, DeliveredGroups: []int{10, 11}, GroupSamples: len(samples)})
	prompt := strings.Repeat("a long question ", 4000) // 64 KB: six of them are more than a message takes
	out, err := slimeRun(t, `
ds = DataSource(prompt_groups(3, prompt=sys.argv[2]))
print_rollout(slime_planact.generate_rollout(rollout_args(sys.argv[1], batch=2, over=3, partial_rollout=True), 9, ds), ds)
`, map[string]string{"PLANACT_ROLE": "planner", "PLANACT_CONFIG": `{"max_turns": 2}`, "PLANACT_STALE": "mask"}, feed, engineServer(t, "4"), prompt)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeRollout(t, out)
	if !slices.Equal(r.Asked, []int{3}) {
		t.Errorf("asked the data source for %v groups, want [3] (--over-sampling-batch-size)", r.Asked)
	}
	var a schema.Arrive
	if err := schema.UnmarshalStrict(r.Published[0].body(t), &a); err != nil {
		t.Fatalf("the Go decoder refuses the arrival: %v", err)
	}
	if a.Config == nil || a.Config.TargetGroups != 2 || a.Config.MaxTurns != 2 || a.Config.ResultSamples != schema.ResultSamplesUndelivered {
		t.Errorf("config %+v: want target_groups 2 (--rollout-batch-size), max_turns 2 and result_samples undelivered", a.Config)
	}
	name := a.TasksObject
	if len(a.Tasks) != 0 || !strings.HasPrefix(name, fmt.Sprintf("rollout-%d-planner-", n)) {
		t.Fatalf("arrival carries %d tasks and tasks_object %q: want the batch in the object store as rollout-%d-planner-<digest>.tasks", len(a.Tasks), name, n)
	}
	data, err := base64.StdEncoding.DecodeString(r.Objects[bus.ObjectTasks(schema.RolePlanner)][name])
	if err != nil {
		t.Fatal(err)
	}
	if got := bus.SHA256(data); a.TasksSHA256 != got {
		t.Errorf("tasks_sha256 %q, the object's is %s", a.TasksSHA256, got)
	}
	var list schema.TaskList
	if err := schema.UnmarshalValueStrict(data, &list, "task list"); err != nil {
		t.Fatalf("the Go decoder refuses the task list: %v", err)
	}
	if len(list.Tasks) != 6 || list.Tasks[5].GroupIndex != 12 || list.Tasks[5].Index != 25 || !strings.HasPrefix(list.Tasks[0].Prompt, prompt) {
		t.Errorf("task list of %d tasks, last %+v", len(list.Tasks), list.Tasks[len(list.Tasks)-1])
	}
	checkBatch(t, r.Groups, byGroup(samples, nil), schema.RolePlanner)
	for _, g := range r.Groups {
		for _, s := range g {
			if s.RemoveSample != (s.Metadata["stale"] == true) {
				t.Errorf("sample %d: remove_sample %v: PLANACT_STALE=mask sets it on the stale sample only", s.Index, s.RemoveSample)
			}
		}
	}
	if len(r.Added) != 1 || len(r.Added[0]) != 2 || r.Added[0][0].GroupIndex != 12 || r.Added[0][1].Index != 25 ||
		r.Added[0][0].Status != "PENDING" || len(r.Added[0][0].Tokens) != 0 {
		t.Errorf("given back to the data source %+v: want group 12 as it was read", r.Added)
	}
	if got, ok := r.Metrics["planact/groups_delivered"]; !ok || got != 2 {
		t.Errorf("metric planact/groups_delivered = %v (there: %v), want 2: the config sent has target_groups, so the groups "+
			"are read as planact delivers them", got, ok)
	}
}

// TestPythonSlimeErrors: what the module refuses, and what planact's
// refusals and time-outs become: errors that say what is wrong, naming the
// variable at fault.
func TestPythonSlimeErrors(t *testing.T) {
	t.Parallel()
	const n = 9
	result := func(status, reason string, samples ...schema.Sample) slimeFeed {
		var feed slimeFeed
		feed.answer(t, subject.Result(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: status, Reason: reason,
			Samples: samples, SampleCount: len(samples), Tasks: trained(10)})
		return feed
	}
	miscounted := func() slimeFeed { // a result that holds fewer samples than it counts
		var feed slimeFeed
		feed.answer(t, subject.Result(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK,
			Samples: plannerSamples(n)[1:2], SampleCount: 2, Tasks: trained(10)})
		return feed
	}
	rejected := func(arrivalID string) slimeFeed {
		var feed slimeFeed
		feed.answer(t, subject.Rejected(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultInvalid,
			Reason: `unknown field "config.max_turn"`, Rejected: true, ArrivalID: arrivalID})
		return feed
	}
	actorResult := func(n int64) slimeFeed {
		var feed slimeFeed
		feed.answer(t, subject.Result(n, schema.RoleActor), &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK,
			Samples: actorSamples(n)[:1], SampleCount: 1, Tasks: trained(0)})
		return feed
	}
	good := plannerSamples(n)[1]
	unsent, uneven, odd := good, good, good
	unsent.Index = 99
	uneven.LossMask = uneven.LossMask[1:]
	odd.Status = "lost"
	engine := engineServer(t, "4")
	for _, c := range []struct {
		name  string
		env   map[string]string
		args  string // more slime args, JSON
		eval  bool
		feed  slimeFeed
		wants string
	}{
		{name: "no role", env: map[string]string{"PLANACT_ROLE": ""}, wants: "ValueError: PLANACT_ROLE='': want planner or actor"},
		{name: "role", env: map[string]string{"PLANACT_ROLE": "critic"}, wants: "ValueError: PLANACT_ROLE='critic'"},
		{name: "config not an object", env: map[string]string{"PLANACT_CONFIG": "[1]"}, wants: "ValueError: PLANACT_CONFIG must be a JSON object"},
		{name: "config not JSON", env: map[string]string{"PLANACT_CONFIG": "{max_turns: 3}"}, wants: "ValueError: PLANACT_CONFIG is not JSON"},
		{name: "config field", env: map[string]string{"PLANACT_CONFIG": `{"target_groups": -1}`}, wants: "ValueError: PLANACT_CONFIG target_groups=-1 is not valid"},
		{name: "stale", env: map[string]string{"PLANACT_STALE": "sometimes"}, wants: "ValueError: PLANACT_STALE='sometimes': want keep, mask or drop"},
		{name: "timeout", env: map[string]string{"PLANACT_TIMEOUT_S": "soon"}, wants: "ValueError: PLANACT_TIMEOUT_S='soon': want a number"},
		{name: "offset", env: map[string]string{"PLANACT_ROLLOUT_OFFSET": "-3"}, wants: "ValueError: PLANACT_ROLLOUT_OFFSET='-3'"},
		{name: "user alone", env: map[string]string{"PLANACT_NATS_USER": "trainer-planner"}, wants: "ValueError: PLANACT_NATS_USER and PLANACT_NATS_PASSWORD go together"},
		{name: "target over the batch", env: map[string]string{"PLANACT_CONFIG": `{"target_groups": 5}`}, wants: "ValueError: PLANACT_CONFIG target_groups=5 is more than the 1 groups"},
		{name: "slime filter", args: `{"dynamic_sampling_filter_path": "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"}`,
			wants: "ValueError: --dynamic-sampling-filter-path runs in slime's own rollout"},
		// Training rollout 5 + 9 would take an evaluation's id.
		{name: "training among the evaluations", env: map[string]string{"PLANACT_ROLLOUT_OFFSET": "5", "PLANACT_EVAL_ROLLOUT_OFFSET": "14", "PLANACT_TIMEOUT_S": "0.3"},
			wants: "ValueError: training rollout 14 (PLANACT_ROLLOUT_OFFSET=5 + slime's rollout_id 9) is among the evaluations' planact rollout ids, from PLANACT_EVAL_ROLLOUT_OFFSET=14 on"},
		{name: "evaluation without eval data", eval: true, wants: "ValueError: evaluation: slime's args name no eval dataset"},
		{name: "eval config", env: map[string]string{"PLANACT_EVAL_CONFIG": "[]"}, wants: "ValueError: PLANACT_EVAL_CONFIG must be a JSON object"},
		// The evaluation before training at rollout 9: PLANACT_EVAL_ROLLOUT_OFFSET + 2 * 9
		// (the actor's job reads no eval file: it needs the datasets' names).
		{name: "evaluation of a training rollout", eval: true, args: `{"eval_prompt_data": ["nq", "/nowhere/nq.jsonl"]}`,
			env: map[string]string{"PLANACT_ROLE": "actor", "PLANACT_EVAL_ROLLOUT_OFFSET": "0", "PLANACT_TIMEOUT_S": "5"}, feed: actorResult(2 * n),
			wants: "PlanactError: planact: not_evaluation: rollout 18 (actor) is not an evaluation"},
		{name: "old nats-server", env: map[string]string{"STANDIN_NATS_SERVER_VERSION": "2.9.10"},
			wants: "PlanactError: planact: unsupported: nats-server too old for planact: nats://127.0.0.1:4222 runs 2.9.10, planact needs 2.12.0 or later"},
		{name: "rejected", feed: rejected(""), wants: `PlanactError: planact: invalid: rollout 9 (planner): unknown field "config.max_turn"`},
		{name: "another arrival's rejection", env: map[string]string{"PLANACT_TIMEOUT_S": "0.3"}, feed: rejected("arrive.9.planner..1"),
			wants: "PlanactError: planact: timeout: no planner result for rollout 9 within PLANACT_TIMEOUT_S=0.3s"},
		{name: "no answer", env: map[string]string{"PLANACT_TIMEOUT_S": "0.3"},
			wants: "PlanactError: planact: timeout: no planner result for rollout 9 within PLANACT_TIMEOUT_S=0.3s"},
		{name: "planact timed out", feed: result(schema.ResultTimeout, "the actor did not arrive within barrier_timeout_s"),
			wants: "PlanactError: planact: timeout: rollout 9 (planner): the actor did not arrive within barrier_timeout_s"},
		{name: "failed", feed: result(schema.ResultFailed, "all 2 episodes failed (2: engine down)"),
			wants: "PlanactError: planact: failed: rollout 9 (planner): all 2 episodes failed (2: engine down)"},
		{name: "nothing to train on", feed: result(schema.ResultPartial, "rollout_timeout_s passed"),
			wants: "PlanactError: planact: empty: rollout 9 gave the planner no samples to train on (status partial; rollout_timeout_s passed"},
		{name: "a task not sent", feed: result(schema.ResultOK, "", unsent), wants: "ValueError: planact returned a planner sample for group 10 index 99"},
		{name: "loss mask", feed: result(schema.ResultOK, "", uneven), wants: "ValueError: planact planner sample '9-0' (group 10, index 20): 6 loss mask entries for 7 response tokens"},
		{name: "status", feed: result(schema.ResultOK, "", odd), wants: "ValueError: planact planner sample '9-0' (group 10, index 20): status 'lost': want one of completed, truncated, aborted, failed"},
		{name: "sample count", feed: miscounted(), wants: "ValueError: rollout 9: its planner result holds 1 samples and counts 2 (sample_count)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{"PLANACT_ROLE": "planner", "PLANACT_ENGINE_URL": engine}
			maps.Copy(env, c.env)
			args, eval := c.args, "false"
			if args == "" {
				args = "{}"
			}
			if c.eval {
				eval = "true"
			}
			out, err := slimeRun(t, `
try:
    slime_planact.generate_rollout(rollout_args(sys.argv[1], batch=1, **json.loads(sys.argv[2])), 9, DataSource(prompt_groups(1)),
                                   evaluation=json.loads(sys.argv[3]))
    print("no error")
except (ValueError, slime_planact.PlanactError) as e:
    print(f"{type(e).__name__}: {e}")
`, env, c.feed, "http://slime-router:30000", args, eval)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, c.wants) {
				t.Errorf("got  %s\nwant %s…", got, c.wants)
			}
		})
	}
}

// TestPythonTrainerRefusesAnOldServer: the Python trainer (trainer.py)
// connected to a nats-server older than planact needs stops at once, in one
// line naming both versions, and sends nothing. (nats-py cannot be
// installed here: the in-memory stand-in plays the old server, giving its
// version as nats-py does.)
func TestPythonTrainerRefusesAnOldServer(t *testing.T) {
	t.Parallel()
	py := python(t)
	examples, err := filepath.Abs("../examples/python")
	if err != nil {
		t.Fatal(err)
	}
	script := `
import asyncio, nats, trainer
try:
    asyncio.run(trainer.rollout("nats://old:4222", 7, "planner", {"url": "http://router:30000"}, "v0",
                                tasks=[{"prompt": "?", "label": "!"}], timeout_s=3600))
    print("no error")
except trainer.ServerTooOld as e:
    print(f"ServerTooOld: {e}; published {len(nats.published)}")
`
	for version, want := range map[string]string{
		"2.9.10": "ServerTooOld: nats-server too old for planact: nats://old:4222 runs 2.9.10, planact needs 2.12.0 or later; published 0",
		"2.11.4": "ServerTooOld: nats-server too old for planact: nats://old:4222 runs 2.11.4, planact needs 2.12.0 or later; published 0",
	} {
		cmd := exec.Command(py, "-c", script)
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "STANDIN_NATS_SERVER_VERSION="+version,
			"PYTHONPATH="+filepath.Join(examples, "testing")+string(os.PathListSeparator)+examples)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python: %v\n%s", err, out)
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("nats-server %s:\ngot  %s\nwant %s", version, got, want)
		}
	}
}

// TestPythonSlimePauseResume: pause and resume publish what the Go decoder
// accepts, as pkg/client does (control.<role>.pause and .resume, the
// pause's Nats-Msg-Id), and return planact's answer to this pause or
// resume, passing over the answer to an earlier one; unanswered, they say
// so. A pause or resume planact refuses (control.<role>.refused, naming
// its id) raises its reason; resume used to return without waiting for
// any answer, and pause waited for its whole time-out.
func TestPythonSlimePauseResume(t *testing.T) {
	t.Parallel()
	const atMs = 1767225600000
	const nonce = "0f0f0f0f0f0f0f0f" // secrets.token_hex(8), patched below
	b64 := func(m schema.Message) string { return base64.StdEncoding.EncodeToString(marshal(t, m)) }
	answer := func(epoch int64, pauseID, mode string) string {
		return b64(&schema.Paused{Role: schema.RolePlanner, Epoch: epoch, PauseID: pauseID,
			Mode: mode, Drained: []string{"planner-gateway-a"}, Aborted: int(epoch) - 1, AtMs: atMs + 40})
	}
	mine := answer(3, fmt.Sprintf("pause.planner.%d.%s", atMs, nonce), schema.PauseAbort)
	another := answer(2, "pause.planner.1767225000000", schema.PauseWait)
	resumed := b64(&schema.Resumed{Role: schema.RolePlanner, ResumeID: fmt.Sprintf("resume.planner.%d.%s", atMs, nonce), WeightVersion: "5", AtMs: atMs + 50})
	refusal := func(verb, id string) string {
		return b64(&schema.Refused{Role: schema.RoleActor, Verb: verb, ID: id, Reason: verb + " of actor: a newer rule", AtMs: atMs + 60})
	}
	// Refusals of another message, then of the pause and of the resume.
	refusals := []string{refusal("pause", "pause.actor.1"), refusal("pause", fmt.Sprintf("pause.actor.%d.%s", atMs, nonce)),
		refusal("resume", fmt.Sprintf("resume.actor.%d.%s", atMs, nonce))}
	out, err := slimeRun(t, `
import time
# two pauses in one millisecond have ids of their own: verb.role.at_ms.<16 hex>
ids = [slime_planact.pause_message("planner", at_ms=1)[1]["Nats-Msg-Id"] for _ in range(2)]
time.time = lambda: 1767225600.0  # the pause's id is pause.<role>.<at_ms>.<nonce>: the one Go answers
slime_planact.secrets.token_hex = lambda n: "0f" * n
mine, another, resumed, other, refused_pause, refused_resume = (base64.b64decode(a) for a in sys.argv[1:7])
# planact answers this pause, then (last on the subject) another one; and the resume
nats.on_publish.append(lambda m: [nats.store("control.planner.paused", a) for a in (mine, another)]
                       if m.subject == "control.planner.pause" else None)
nats.on_publish.append(lambda m: nats.store("control.planner.resumed", resumed) if m.subject == "control.planner.resume" else None)
answer = slime_planact.pause("planner", mode="abort", timeout_s=120, reason="weights 5")
resume_answer = slime_planact.resume("planner", 5)
try:
    slime_planact.pause("actor", wait_s=0.3)
    unanswered = "answered"
except slime_planact.PlanactError as e:
    unanswered = str(e)
try:
    slime_planact.pause("planner", mode="later")
except ValueError as e:
    bad_mode = str(e)
# planact refuses the actor's pause and resume, after another message's refusal
nats.on_publish.append(lambda m: [nats.store("control.actor.refused", a) for a in (other, refused_pause)]
                       if m.subject == "control.actor.pause" else None)
nats.on_publish.append(lambda m: nats.store("control.actor.refused", refused_resume) if m.subject == "control.actor.resume" else None)
refused = []
for call in (lambda: slime_planact.pause("actor", timeout_s=60), lambda: slime_planact.resume("actor", 6)):
    try:
        call()
        refused.append("taken")
    except slime_planact.PlanactError as e:
        refused.append(str(e))
print(json.dumps({"ids": ids, "answer": answer, "resumed": resume_answer, "published": published(), "unanswered": unanswered,
                  "bad_mode": bad_mode, "refused": refused, "servers": [c["servers"] for c in nats.connections]}))
`, map[string]string{"PLANACT_NATS_URL": "nats://planact:4222"}, slimeFeed{}, append([]string{mine, another, resumed}, refusals...)...)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		IDs        []string       `json:"ids"`
		Answer     map[string]any `json:"answer"`
		Resumed    map[string]any `json:"resumed"`
		Published  []pyMsg        `json:"published"`
		Unanswered string         `json:"unanswered"`
		BadMode    string         `json:"bad_mode"`
		Refused    []string       `json:"refused"`
		Servers    [][]string     `json:"servers"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	if len(r.IDs) != 2 || r.IDs[0] == r.IDs[1] || !regexp.MustCompile(`^pause\.planner\.1\.[0-9a-f]{16}$`).MatchString(r.IDs[0]) {
		t.Errorf("two pauses in one millisecond have ids %q: want pause.planner.1.<16 hex>, each its own", r.IDs)
	}
	if len(r.Published) != 5 {
		t.Fatalf("published %d messages, want a pause, a resume, a pause, and a pause and a resume refused", len(r.Published))
	}
	if r.Resumed["resume_id"] != fmt.Sprintf("resume.planner.%d.%s", atMs, nonce) || r.Resumed["weight_version"] != "5" {
		t.Errorf("resume returned %v: want planact's answer to it", r.Resumed)
	}
	if want := []string{
		fmt.Sprintf("planact: refused: pause pause.actor.%d.%s: pause of actor: a newer rule", atMs, nonce),
		fmt.Sprintf("planact: refused: resume resume.actor.%d.%s: resume of actor: a newer rule", atMs, nonce),
	}; !slices.Equal(r.Refused, want) {
		t.Errorf("refused pause and resume: %q, want %q", r.Refused, want)
	}
	var p schema.Pause
	if err := schema.UnmarshalStrict(r.Published[0].body(t), &p); err != nil {
		t.Fatalf("the Go decoder refuses the pause: %v", err)
	}
	if r.Published[0].Subject != p.Subject() || p.Role != schema.RolePlanner || p.Mode != schema.PauseAbort || p.TimeoutS != 120 ||
		p.Reason != "weights 5" || p.AtMs != atMs {
		t.Errorf("pause %+v on %s", p, r.Published[0].Subject)
	}
	p.Nonce = nonce // in the id only, not in the body
	var res schema.Resume
	if err := schema.UnmarshalStrict(r.Published[1].body(t), &res); err != nil {
		t.Fatalf("the Go decoder refuses the resume: %v", err)
	}
	res.Nonce = nonce
	if r.Published[1].Subject != res.Subject() || res.Role != schema.RolePlanner || res.WeightVersion != "5" {
		t.Errorf("resume %+v on %s", res, r.Published[1].Subject)
	}
	for i, m := range []schema.Message{&p, &res} {
		h := r.Published[i].Headers
		if h["Nats-Msg-Id"] != m.MsgID() || h[schema.HdrSchema] != m.Kind() || h[schema.HdrRole] != schema.RolePlanner ||
			h[schema.HdrContentType] != schema.ContentType || h[schema.HdrRollout] != "" {
			t.Errorf("%s headers %v (the Go client would send id %q)", m.Kind(), h, m.MsgID())
		}
	}
	if r.Answer["epoch"] != 3.0 || r.Answer["aborted"] != 2.0 || r.Answer["pause_id"] != p.MsgID() {
		t.Errorf("pause returned %v: want the answer to %s (epoch 3)", r.Answer, p.MsgID())
	}
	if want := fmt.Sprintf("planact: timeout: no answer to pause pause.actor.%d.%s on control.actor.paused within 0.3s", atMs, nonce); r.Unanswered != want {
		t.Errorf("unanswered pause: %q, want %q", r.Unanswered, want)
	}
	if r.BadMode != "pause mode 'later': want wait or abort" {
		t.Errorf("pause with mode later: %q", r.BadMode)
	}
	if len(r.Servers) != 5 || r.Servers[0][0] != "nats://planact:4222" {
		t.Errorf("connected to %v: want PLANACT_NATS_URL", r.Servers)
	}
}

// TestPythonSlimeOlderSlime: with an older slime (no Sample.rollout_id,
// no Status.FAILED, no remove_sample, no RolloutFnTrainOutput) a failed
// sample becomes ABORTED, the batch is returned as the plain list, and
// PLANACT_STALE=mask is refused saying why.
func TestPythonSlimeOlderSlime(t *testing.T) {
	t.Parallel()
	const n = 9
	samples := plannerSamples(n)
	var feed slimeFeed
	feed.answer(t, subject.Result(n, schema.RoleActor), &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, Samples: samples, SampleCount: len(samples)})
	out, err := slimeRun(t, `
import os
from dataclasses import dataclass, field
from enum import Enum

@dataclass
class OlderSample:  # slime.utils.types.Sample of Oct 2025
    group_index: int | None = None
    index: int | None = None
    prompt: str = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)

slime_planact.Sample, slime_planact.RolloutFnTrainOutput = OlderSample, None
out = slime_planact.generate_rollout(rollout_args(sys.argv[1]), 9, DataSource([]))
os.environ["PLANACT_STALE"] = "mask"
try:
    slime_planact.settings_from_env()
    mask = "accepted"
except ValueError as e:
    mask = str(e)
print(json.dumps({"type": type(out).__name__, "mask": mask,
                  "batch": [[{"index": s.index, "status": s.status.name, "rollout_id": hasattr(s, "rollout_id"), "tokens": s.tokens}
                             for s in g] for g in out]}))
`, map[string]string{"PLANACT_ROLE": "actor", "PLANACT_ENGINE_URL": engineServer(t, "4")}, feed, "http://slime-router:30000")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Type, Mask string
		Batch      [][]struct {
			Index     int
			Status    string
			RolloutID bool `json:"rollout_id"`
			Tokens    []int
		}
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	if r.Type != "list" || len(r.Batch) != 2 || len(r.Batch[1]) != 2 {
		t.Fatalf("returned a %s of %d groups: want the list of 2 groups", r.Type, len(r.Batch))
	}
	statuses := map[int]string{20: "COMPLETED", 21: "TRUNCATED", 22: "COMPLETED", 23: "ABORTED"}
	for _, g := range r.Batch {
		for _, s := range g {
			if s.Status != statuses[s.Index] || s.RolloutID {
				t.Errorf("sample %d: %s, has a rollout_id %v; want %s and none", s.Index, s.Status, s.RolloutID, statuses[s.Index])
			}
		}
	}
	if !slices.Equal(r.Batch[0][0].Tokens, samples[1].Tokens) {
		t.Errorf("tokens %v, want %v", r.Batch[0][0].Tokens, samples[1].Tokens)
	}
	if !strings.HasPrefix(r.Mask, "PLANACT_STALE=mask needs slime's Sample.remove_sample") {
		t.Errorf("mask on an older slime: %q", r.Mask)
	}
}

// TestPythonSlimeTrainingSampling: slime's trainer computes a role's
// log-probs at --rollout-temperature (the logits divided by it, "to match
// rollout-time log-probs") and, with --rollout-top-p below 1, over the
// nucleus the engine replays (Sample.rollout_top_p_token_ids, which
// RolloutManager asserts and planact does not return). A training rollout
// whose role samples at another temperature (a null one is planact's
// default 1), or with top_p below 1, or a
// job with --rollout-top-p below 1, is refused before the data source is
// read or anything is sent, naming both values; where they agree, the
// rollout goes through slime's RolloutManager (the stand-in). The other
// role's sampling plays no part.
func TestPythonSlimeTrainingSampling(t *testing.T) {
	t.Parallel()
	const n = 9
	ps := plannerSamples(n)
	var planner, actor slimeFeed
	planner.answer(t, subject.Result(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK,
		Samples: []schema.Sample{ps[1], ps[3]}, SampleCount: 2, Tasks: trained(10)})
	actor.answer(t, subject.Result(n, schema.RoleActor), &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK,
		Samples: actorSamples(n)[:3], SampleCount: 3, Tasks: trained(0)})
	engine := engineServer(t, "4")
	for _, c := range []struct {
		name, role, config, args string
		wants                    string // the error's start; "" for none
	}{
		{name: "planner hotter than slime", role: schema.RolePlanner, config: `{"planner_sampling": {"temperature": 0.7}}`, args: `{}`,
			wants: "ValueError: PLANACT_CONFIG planner_sampling.temperature 0.7 (planact's default 1) differs from --rollout-temperature 1 (slime's default 1)"},
		{name: "actor", role: schema.RoleActor, config: `{"actor_sampling": {"temperature": 0.7}}`, args: `{"rollout_temperature": 1.0}`,
			wants: "ValueError: PLANACT_CONFIG actor_sampling.temperature 0.7 (planact's default 1) differs from --rollout-temperature 1"},
		{name: "slime hotter than planact's default", role: schema.RoleActor, config: `{"planner_sampling": {"temperature": 1.2}}`, args: `{"rollout_temperature": 1.2}`,
			wants: "ValueError: PLANACT_CONFIG actor_sampling.temperature 1 (planact's default 1) differs from --rollout-temperature 1.2"},
		// null is planact's default, 1: checked as 1 is.
		{name: "planner temperature null", role: schema.RolePlanner, config: `{"planner_sampling": {"temperature": null}}`, args: `{"rollout_temperature": 0.7}`,
			wants: "ValueError: PLANACT_CONFIG planner_sampling.temperature 1 (planact's default 1) differs from --rollout-temperature 0.7"},
		{name: "nulls agree", role: schema.RoleActor, config: `{"actor_sampling": {"temperature": null, "top_p": null}}`, args: `{}`},
		{name: "slime top-p", role: schema.RolePlanner, config: `{}`, args: `{"rollout_top_p": 0.9}`,
			wants: "ValueError: --rollout-top-p 0.9: slime then trains on the top-p nucleus the engine replays"},
		{name: "planact top-p", role: schema.RolePlanner, config: `{"planner_sampling": {"top_p": 0.95}}`, args: `{}`,
			wants: "ValueError: PLANACT_CONFIG planner_sampling.top_p 0.95"},
		{name: "planner agrees", role: schema.RolePlanner, config: `{"planner_sampling": {"temperature": 0.7, "top_p": 1}, "actor_sampling": {"temperature": 0.3, "top_p": 0.5}}`,
			args: `{"rollout_temperature": 0.7, "rollout_top_p": 1.0}`},
		{name: "actor agrees", role: schema.RoleActor, config: `{"planner_sampling": {"temperature": 0.3, "top_p": 0.5}, "actor_sampling": {"temperature": 0.7}}`,
			args: `{"rollout_temperature": 0.7}`},
		{name: "defaults", role: schema.RoleActor, config: ``, args: `{}`},
		// slime's own group normalization goes by sample count, not by
		// planact's groups: refused, for both roles.
		{name: "actor without the reward hook", role: schema.RoleActor, config: ``, args: `{"custom_reward_post_process_path": null}`,
			wants: "ValueError: --advantage-estimator grpo normalizes rewards within groups, and without --custom-reward-post-process-path"},
		{name: "planner without the reward hook", role: schema.RolePlanner, config: ``, args: `{"custom_reward_post_process_path": null, "advantage_estimator": "reinforce_plus_plus_baseline"}`,
			wants: "ValueError: --advantage-estimator reinforce_plus_plus_baseline normalizes rewards within groups"},
		{name: "no normalization", role: schema.RoleActor, config: ``, args: `{"custom_reward_post_process_path": null, "rewards_normalization": false}`},
		{name: "ppo", role: schema.RoleActor, config: ``, args: `{"custom_reward_post_process_path": null, "advantage_estimator": "ppo"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			feed := planner
			if c.role == schema.RoleActor {
				feed = actor
			}
			out, err := slimeRun(t, `
from slime.ray.rollout import RolloutManager
args = rollout_args(sys.argv[1], batch=1, **{**dict(global_batch_size=1, advantage_estimator="grpo", rewards_normalization=True,
                    grpo_std_normalization=True, reward_key=None, use_dynamic_batch_size=False, micro_batch_size=1,
                    max_tokens_per_gpu=None, balance_data=False, balance_by_flops=False,
                    rollout_function_path="slime_planact.generate_rollout",
                    custom_reward_post_process_path="slime_planact.reward_post_process",
                    custom_convert_samples_to_train_data_path=None), **json.loads(sys.argv[2])})
manager = RolloutManager(args)
manager.data_source = ds = DataSource(prompt_groups(1))
error, samples = None, 0
try:
    samples = len(manager.generate(9)[0])
except Exception as e:
    error = f"{type(e).__name__}: {e}"
print(json.dumps({"error": error, "samples": samples, "published": len(nats.published), "asked": ds.asked}))
`, map[string]string{"PLANACT_ROLE": c.role, "PLANACT_ENGINE_URL": engine, "PLANACT_CONFIG": c.config, "PLANACT_TIMEOUT_S": "5"},
				feed, engine, c.args)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Error     *string `json:"error"`
				Samples   int     `json:"samples"`
				Published int     `json:"published"`
				Asked     []int   `json:"asked"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("python printed %q: %v", out, err)
			}
			if c.wants == "" {
				if got.Error != nil || got.Samples == 0 || got.Published != 1 {
					t.Errorf("error %v, %d samples, %d messages sent: want the rollout trained on", deref(got.Error), got.Samples, got.Published)
				}
				return
			}
			if got.Error == nil || !strings.HasPrefix(*got.Error, c.wants) {
				t.Errorf("error %q\nwant      %q…", deref(got.Error), c.wants)
			}
			if got.Published != 0 || len(got.Asked) != 0 {
				t.Errorf("sent %d messages and asked the data source for %v before refusing: want nothing", got.Published, got.Asked)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<none>"
	}
	return *s
}

// TestPythonSlimeEvalTimeout: an evaluation rollout runs with the
// evaluation's config, whose time-outs PLANACT_EVAL_CONFIG may set longer
// than training's; without PLANACT_TIMEOUT_S each job waits for it as long
// as that config's barrier_timeout_s + rollout_timeout_s + 300 (the
// actor's job too, though it sends no config), not the training config's,
// which would give up while planact still runs the evaluation. A
// PLANACT_TIMEOUT_S given wins.
func TestPythonSlimeEvalTimeout(t *testing.T) {
	t.Parallel()
	evalData := filepath.Join(t.TempDir(), "nq.jsonl")
	if err := os.WriteFile(evalData, []byte(`{"question": "What is the capital of France?", "answer": "Paris"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	engine := engineServer(t, "4")
	for _, c := range []struct {
		name string
		env  map[string]string
		want float64
	}{
		{name: "eval config's", env: map[string]string{"PLANACT_CONFIG": `{"rollout_timeout_s": 600, "barrier_timeout_s": 60}`,
			"PLANACT_EVAL_CONFIG": `{"rollout_timeout_s": 7200, "max_turns": 6}`}, want: 60 + 7200 + 300},
		{name: "training config's", env: map[string]string{"PLANACT_CONFIG": `{"rollout_timeout_s": 600}`}, want: 1800 + 600 + 300},
		{name: "given", env: map[string]string{"PLANACT_CONFIG": `{"rollout_timeout_s": 600}`, "PLANACT_EVAL_CONFIG": `{"rollout_timeout_s": 7200}`,
			"PLANACT_TIMEOUT_S": "50"}, want: 50},
	} {
		for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
			t.Run(c.name+"/"+role, func(t *testing.T) {
				t.Parallel()
				env := map[string]string{"PLANACT_ROLE": role, "PLANACT_ENGINE_URL": engine}
				maps.Copy(env, c.env)
				out, err := slimeRun(t, `
args = rollout_args(sys.argv[1], eval_prompt_data=["nq", sys.argv[2]], input_key="question", label_key="answer")
print(json.dumps([a.settings.timeout_s for a in slime_planact.eval_arrivals(args, 3, slime_planact.settings_from_env())]))
`, env, slimeFeed{}, engine, evalData)
				if err != nil {
					t.Fatal(err)
				}
				var got []float64
				if err := json.Unmarshal(out, &got); err != nil {
					t.Fatalf("python printed %q: %v", out, err)
				}
				if len(got) != 1 || got[0] != c.want {
					t.Errorf("the evaluation waits %v s, want %v", got, c.want)
				}
			})
		}
	}
}
