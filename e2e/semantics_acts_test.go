package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/pkg/dag"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestSemanticsRetries: transient actor failures are retried with back-off
// up to act_retries; a call that times out counts as a failed attempt; after
// the last attempt the node is failed and its dependents skipped. A retried
// act gives one outcome and one sample, whatever its attempts.
func TestSemanticsRetries(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	tasks := []schema.Task{
		e.question(0, population("France"), sim.FaultTimes(sim.FaultActorError, 1)),
		e.question(1, population("Germany"), sim.FaultActorError),
		e.question(2, population("Spain"), sim.FaultTimes(sim.FaultActorHang, 1)),
		e.question(3, population("Italy"), sim.FaultTimes(sim.FaultActorHang, 2)),
	}
	// The act time-out is long enough for a healthy call on a loaded test
	// machine; only the hangs reach it.
	cfg := &schema.Config{ActRetries: 1, ActTimeoutS: 4, FailurePolicy: schema.PolicySkip, MaxTurns: 3}
	const n = 201
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, cfg, false)
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("results: %v %v %+v", o.perr, o.aerr, o.planner)
	}
	d := e.dones(t, n)
	want := map[string]struct {
		status   string
		attempts int
		err      string
	}{
		"0/t1-s1": {schema.ActDoneOK, 2, ""},          // a 500, then an answer
		"1/t1-s1": {schema.ActFailed, 2, "500"},       // 1 + act_retries attempts, then failed
		"2/t1-s1": {schema.ActDoneOK, 2, ""},          // a hang cut by the act time-out, then an answer
		"3/t1-s1": {schema.ActFailed, 2, "timed out"}, // every attempt timed out
		"3/t2-s1": {schema.ActDoneOK, 1, ""},          // planned again in the next turn, it works
	}
	for key, w := range want {
		got, ok := d[key]
		if !ok {
			t.Errorf("act %s: no outcome", key)
			continue
		}
		if got.Status != w.status || got.Attempts != w.attempts || !strings.Contains(got.Error, w.err) {
			t.Errorf("act %s: %s after %d attempts (%q), want %s after %d (%q)", key, got.Status, got.Attempts, got.Error, w.status, w.attempts, w.err)
		}
	}
	for _, ep := range []int{1, 3} {
		r := e.run(t, n, ep, 1)
		if s := byKeyStatus(r, "t1-s2"); s != schema.NodeSkipped {
			t.Errorf("episode %d: dependent of the failed node is %s, want skipped", ep, s)
		}
		if _, ok := d[keyOf(ep, "t1-s2")]; ok {
			t.Errorf("episode %d: the skipped node ran", ep)
		}
	}
	for ep, status := range []string{schema.EpisodeCompleted, schema.EpisodeTruncated, schema.EpisodeCompleted, schema.EpisodeCompleted} {
		s, ok := sampleOf(o.planner, n, ep)
		if !ok || s.Status != status {
			t.Errorf("episode %d: planner sample %v status %q, want %q", ep, ok, s.Status, status)
		}
		if status == schema.EpisodeCompleted && s.Reward != 1 {
			t.Errorf("episode %d: reward %v after recovered retries", ep, s.Reward)
		}
	}
	st := o.planner.Stats
	if st.Failures["error"] != 3 || st.Failures["timeout"] != 1 {
		t.Errorf("failures %v, want 3 errors (one per turn) and 1 time-out", st.Failures)
	}
	// One sample per act that produced a generation; none for failed ones.
	var executed []string
	for key, x := range d {
		if x.Status == schema.ActDoneOK {
			executed = append(executed, key)
		}
	}
	sort.Strings(executed)
	if got := actorKeys(o.actor); !reflect.DeepEqual(got, executed) {
		t.Errorf("actor samples %v, want one per executed act %v", got, executed)
	}
	for _, s := range o.actor.Samples {
		checkTokenExact(t, s)
		if s.RolloutID == "201-0" && s.Metadata["key"] == "t1-s1" && asInt(s.Metadata["attempts"]) != 2 {
			t.Errorf("retried act sample: attempts %v", s.Metadata["attempts"])
		}
	}
}

// TestSemanticsPermanentFailures: an HTTP tool that answers 400 fails the
// node at once, an HTTP 503 is retried, and a node whose arguments hold no
// input fails at once without calling anything.
func TestSemanticsPermanentFailures(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	var mu sync.Mutex
	calls := map[string]int{}
	tool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Queries []string `json:"queries"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		q := strings.Join(body.Queries, " ")
		mu.Lock()
		calls[q]++
		k := calls[q]
		mu.Unlock()
		switch {
		case strings.Contains(q, "France"):
			http.Error(w, "no such index", http.StatusBadRequest)
		case strings.Contains(q, "Germany") && k == 1:
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		default:
			v, _ := e.world.Lookup(q)
			_, _ = w.Write([]byte(v))
		}
	}))
	t.Cleanup(tool.Close)
	tasks := []schema.Task{e.question(0, population("France")), e.question(1, population("Germany"))}
	cfg := &schema.Config{
		Tools:         []schema.Tool{{Name: "search", Description: "look up one fact", Kind: schema.ToolHTTP, URL: tool.URL}},
		FailurePolicy: schema.PolicyFail, ActRetries: 3,
	}
	const n = 211
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, cfg, false)
	if o.perr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("result: %v %+v", o.perr, o.planner)
	}
	d := e.dones(t, n)
	if x := d["0/t1-s1"]; x.Status != schema.ActFailed || x.Attempts != 1 || !strings.Contains(x.Error, "400") {
		t.Errorf("HTTP 400: %s after %d attempts (%q), want failed after 1", x.Status, x.Attempts, x.Error)
	}
	if calls["capital of France"] != 1 {
		t.Errorf("the tool was called %d times for a permanent failure", calls["capital of France"])
	}
	if x := d["1/t1-s1"]; x.Status != schema.ActDoneOK || x.Attempts != 2 {
		t.Errorf("HTTP 503 once: %s after %d attempts, want done after 2", x.Status, x.Attempts)
	}
	if s, _ := sampleOf(o.planner, n, 0); s.Status != schema.EpisodeFailed {
		t.Errorf("episode 0 (policy fail): %s", s.Status)
	}
	if s, _ := sampleOf(o.planner, n, 1); s.Status != schema.EpisodeCompleted || s.Reward != 1 {
		t.Errorf("episode 1: %s reward %v", s.Status, s.Reward)
	}
	if len(o.actor.Samples) != 0 {
		t.Errorf("HTTP tools gave %d actor samples", len(o.actor.Samples))
	}

	// Invalid arguments: a node with no string argument.
	s := startSem(t, semOptions{scripted: true})
	s.scriptPlanner(t, 212, func(ep, turn int, obs string) string {
		if turn == 1 {
			return `{"nodes":[{"id":"T1","tool":"search","args":{"query":7},"depends_on":[]}]}`
		}
		return "<answer>unknown</answer>"
	})
	o = s.rollout(t, s.trainer(t), s.trainer(t), 212, []schema.Task{s.question(0, population("Spain"))}, &schema.Config{ActRetries: 3}, false)
	if o.perr != nil {
		t.Fatal(o.perr)
	}
	if x := s.dones(t, 212)["0/t1-T1"]; x.Status != schema.ActFailed || x.Attempts != 1 || !strings.Contains(x.Error, "invalid arguments") {
		t.Errorf("invalid arguments: %s after %d attempts (%q)", x.Status, x.Attempts, x.Error)
	}
	if o.planner.Stats.Failures["invalid"] != 1 {
		t.Errorf("failures %v, want one invalid", o.planner.Stats.Failures)
	}
	if p, _ := sampleOf(o.planner, 212, 0); !strings.Contains(p.Response, "ERROR: invalid arguments") {
		t.Errorf("the planner did not see the failure:\n%s", p.Response)
	}
}

// TestSemanticsFailurePolicies: the same failing act under each policy.
// Episode 0's first lookup always fails; episode 2's fails for one turn
// (1 + act_retries attempts) and works when planned again.
func TestSemanticsFailurePolicies(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	countries := map[string][3]string{
		schema.PolicySkip:   {"France", "Germany", "Spain"},
		schema.PolicyReplan: {"Italy", "Poland", "Sweden"},
		schema.PolicyFail:   {"Norway", "Japan", "China"},
	}
	results := map[string]outcome{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, policy := range []string{schema.PolicySkip, schema.PolicyReplan, schema.PolicyFail} {
		c := countries[policy]
		tasks := []schema.Task{
			e.question(0, population(c[0]), sim.FaultActorError),
			e.question(1, population(c[1])),
			e.question(2, population(c[2]), sim.FaultTimes(sim.FaultActorError, 2)),
		}
		cfg := &schema.Config{FailurePolicy: policy, ActRetries: 1, MaxTurns: 3}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := e.rollout(t, e.trainer(t), e.trainer(t), int64(301+i), tasks, cfg, false)
			mu.Lock()
			results[policy] = o
			mu.Unlock()
		}()
	}
	wg.Wait()
	for i, policy := range []string{schema.PolicySkip, schema.PolicyReplan, schema.PolicyFail} {
		o, n := results[policy], int64(301+i)
		if o.perr != nil || o.planner.Status != schema.ResultOK {
			t.Fatalf("%s: %v %+v", policy, o.perr, o.planner)
		}
		if o.planner.Stats.Failures["error"] == 0 {
			t.Errorf("%s: no failures in the stats: %v", policy, o.planner.Stats.Failures)
		}
		p0, _ := sampleOf(o.planner, n, 0)
		p1, _ := sampleOf(o.planner, n, 1)
		p2, _ := sampleOf(o.planner, n, 2)
		if p1.Status != schema.EpisodeCompleted || p1.Reward != 1 {
			t.Errorf("%s: the healthy episode ended %s, reward %v", policy, p1.Status, p1.Reward)
		}
		switch policy {
		case schema.PolicySkip:
			if !strings.Contains(p0.Response, "ERROR: ") || !strings.Contains(p0.Response, "SKIPPED: dependency s1 failed") || strings.Contains(p0.Response, "Re-plan") {
				t.Errorf("skip: observations do not say what failed and what was skipped:\n%s", p0.Response)
			}
			if p0.Status != schema.EpisodeTruncated || p2.Status != schema.EpisodeCompleted || p2.Reward != 1 {
				t.Errorf("skip: episodes ended %s and %s (reward %v)", p0.Status, p2.Status, p2.Reward)
			}
		case schema.PolicyReplan:
			if !strings.Contains(p0.Response, "Some steps failed (s1: ") || !strings.Contains(p0.Response, "Re-plan the remaining steps") {
				t.Errorf("replan: the planner was not told to re-plan:\n%s", p0.Response)
			}
			if p2.Status != schema.EpisodeCompleted || p2.Reward != 1 || asInt(p2.Metadata["turns"]) != 3 {
				t.Errorf("replan: the recovering episode ended %s after %v turns (reward %v)", p2.Status, p2.Metadata["turns"], p2.Reward)
			}
		case schema.PolicyFail:
			for _, p := range []schema.Sample{p0, p2} {
				if p.Status != schema.EpisodeFailed || !strings.Contains(p.Metadata["end_reason"].(string), "act failed") || asInt(p.Metadata["turns"]) != 1 {
					t.Errorf("fail: episode %s ended %s after %v turns (%v)", p.RolloutID, p.Status, p.Metadata["turns"], p.Metadata["end_reason"])
				}
			}
			if st := o.planner.Stats.EpisodeStatus; st[schema.EpisodeFailed] != 2 || st[schema.EpisodeCompleted] != 1 {
				t.Errorf("fail: episode statuses %v", st)
			}
		}
	}
}

// TestSemanticsDuplicateGuard: a call repeated within a turn waits for the
// first and takes its result; a call repeated in a later turn is answered
// from the earlier turn; placeholders are substituted before comparing.
// Cached nodes run nothing and give no actor sample.
func TestSemanticsDuplicateGuard(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{scripted: true})
	const n = 221
	var mu sync.Mutex
	observed := map[int]string{}
	e.scriptPlanner(t, n, func(ep, turn int, obs string) string {
		mu.Lock()
		observed[turn] = obs
		mu.Unlock()
		switch turn {
		case 1:
			return `<graph><node id="s1">search("capital of France")</node><node id="s2">search("capital of France")</node></graph>`
		case 2:
			return `<graph><node id="a">search("capital of France")</node><node id="b" depends="a">search("population of {a}")</node><node id="c">search("population of Paris")</node></graph>`
		}
		return "<answer>2.1 million</answer>"
	})
	before, _ := e.actorEngine.Stats()
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, []schema.Task{e.question(0, population("France"))}, nil, false)
	if o.perr != nil || o.aerr != nil {
		t.Fatal(o.perr, o.aerr)
	}
	if after, _ := e.actorEngine.Stats(); after-before != 2 {
		t.Errorf("the actor engine ran %d generations for 2 distinct calls", after-before)
	}
	if got, want := actorKeys(o.actor), []string{"0/t1-s1", "0/t2-c"}; !reflect.DeepEqual(got, want) {
		t.Errorf("actor samples %v, want %v", got, want)
	}
	d := e.dones(t, n)
	for key, from := range map[string]string{"0/t1-s2": "t1-s1", "0/t2-a": "t1-s1", "0/t2-b": "t2-c"} {
		if x := d[key]; x.Status != schema.ActCached || x.Attempts != 0 {
			t.Errorf("act %s: %s after %d attempts, want cached", key, x.Status, x.Attempts)
		}
		key := key[2:]
		r := e.run(t, n, 0, int(key[1]-'0'))
		for _, ns := range r.Nodes {
			if ns.Key == key && (ns.Status != schema.NodeCached || ns.CachedFrom != from) {
				t.Errorf("node %s: %s cached from %q, want from %s", key, ns.Status, ns.CachedFrom, from)
			}
		}
	}
	mu.Lock()
	obs := observed[3]
	mu.Unlock()
	for _, line := range []string{`a search("capital of France") -> Paris`, `b search("population of Paris") -> 2.1 million`, `c search("population of Paris") -> 2.1 million`} {
		if !strings.Contains(obs, line) {
			t.Errorf("observation of turn 2 lacks %q:\n%s", line, obs)
		}
	}
	p, _ := sampleOf(o.planner, n, 0)
	checkTokenExact(t, p)
	if p.Status != schema.EpisodeCompleted || p.Reward != 1 {
		t.Errorf("episode: %s reward %v", p.Status, p.Reward)
	}
	if o.actor.Stats.Acts != 2 || o.actor.Stats.CachedActs != 3 {
		t.Errorf("stats: %d acts and %d cached, want 2 and 3", o.actor.Stats.Acts, o.actor.Stats.CachedActs)
	}
}

// TestSemanticsSchedules: in sequential mode no two acts of a turn overlap;
// in levels mode no node of level L+1 starts before every node of level L
// ended. (Eager's overlap is shown by TestSemanticsCancelWhileNextRuns.)
// The assertions are causal orders of the outcomes' timestamps, which the
// dispatcher guarantees, not durations.
func TestSemanticsSchedules(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	compare := func(a, b string) string {
		return "Which capital has the larger population, the capital of " + a + " or the capital of " + b + "?"
	}
	chain3 := func(c string) string {
		return "What is the population of the capital of the largest neighbor of " + c + "?"
	}
	modes := []string{schema.ScheduleSequential, schema.ScheduleLevels, schema.ScheduleEager}
	outs := make([]outcome, len(modes))
	var wg sync.WaitGroup
	for i, mode := range modes {
		tasks := []schema.Task{e.question(0, compare("France", "Japan")), e.question(1, compare("Kenya", "Peru")), e.question(2, chain3("Spain"))}
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = e.rollout(t, e.trainer(t), e.trainer(t), int64(231+i), tasks, &schema.Config{Schedule: mode}, false)
		}()
	}
	wg.Wait()
	for i, mode := range modes {
		n := int64(231 + i)
		o := outs[i]
		if o.perr != nil || o.planner.Status != schema.ResultOK || o.planner.Stats.Accuracy != 1 {
			t.Fatalf("%s: %v %+v", mode, o.perr, o.planner.Stats)
		}
		d := e.dones(t, n)
		for ep := 0; ep < 3; ep++ {
			r := e.run(t, n, ep, 1)
			level := nodeLevels(t, r)
			var acts []schema.ActDone
			for _, ns := range r.Nodes {
				x, ok := d[keyOf(ep, ns.Key)]
				if !ok {
					t.Fatalf("%s: act %s has no outcome", mode, ns.Key)
				}
				acts = append(acts, x)
			}
			if len(acts) < 3 {
				t.Fatalf("%s episode %d: %d acts in turn 1", mode, ep, len(acts))
			}
			switch mode {
			case schema.ScheduleSequential:
				sort.Slice(acts, func(i, j int) bool { return acts[i].StartedMs < acts[j].StartedMs })
				for k := 1; k < len(acts); k++ {
					if acts[k].StartedMs < acts[k-1].EndedMs {
						t.Errorf("sequential: %s started at %d before %s ended at %d", acts[k].Key, acts[k].StartedMs, acts[k-1].Key, acts[k-1].EndedMs)
					}
				}
			case schema.ScheduleLevels:
				for _, a := range acts {
					for _, b := range acts {
						if level[b.NodeID] == level[a.NodeID]+1 && b.StartedMs < a.EndedMs {
							t.Errorf("levels: %s (level %d) started at %d before %s (level %d) ended at %d",
								b.Key, level[b.NodeID], b.StartedMs, a.Key, level[a.NodeID], a.EndedMs)
						}
					}
				}
			}
		}
	}
}

func nodeLevels(t *testing.T, r schema.Run) map[string]int {
	t.Helper()
	ids := make([]string, len(r.Nodes))
	deps := map[string][]string{}
	for i, n := range r.Nodes {
		ids[i], deps[n.Node.ID] = n.Node.ID, n.Node.Deps
	}
	levels, err := dag.Levels(ids, deps)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for l, ids := range levels {
		for _, id := range ids {
			out[id] = l
		}
	}
	return out
}

func keyOf(ep int, key string) string { return string(rune('0'+ep)) + "/" + key }

func byKeyStatus(r schema.Run, key string) string {
	for _, n := range r.Nodes {
		if n.Key == key {
			return n.Status
		}
	}
	return ""
}

// TestSemanticsLongActStaysInProgress: an act that runs for several ack
// waits does not move its turn to another replica meanwhile, because the
// consume loop keeps telling JetStream the turn's plan is in progress; it
// runs once.
func TestSemanticsLongActStaysInProgress(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{
		planner: sim.Config{Seed: 31},
		actor:   sim.Config{Seed: 32, TTFT: 3 * time.Second},
		ackWait: time.Second, // in progress every 333ms: slack for a loaded machine
	})
	tasks := []schema.Task{e.question(0, population("Peru"))}
	o := <-e.start(t, 300, tasks, &schema.Config{ActTimeoutS: 30})
	if o.perr != nil || o.aerr != nil {
		t.Fatalf("rollout: %v %v", o.perr, o.aerr)
	}
	info := e.turnConsumer(t)
	if info.NumRedelivered != 0 {
		t.Errorf("%d turns redelivered while their acts ran (ack wait 1s, acts 3s)", info.NumRedelivered)
	}
	requests, _ := e.actorEngine.Stats()
	if acts := len(o.actor.Samples); acts != 2 || requests != int64(acts) {
		t.Errorf("actor engine served %d generations for %d acts, want 2 and 2", requests, acts)
	}
}
