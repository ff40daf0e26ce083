package e2e

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/telemetry"
)

// otlpReceiver is an OTLP/HTTP collector in the test's process: it decodes
// every ExportTraceServiceRequest posted to /v1/traces and keeps its spans.
type otlpReceiver struct {
	mu       sync.Mutex
	spans    []*span
	services map[string]bool
	bad      []string
}

// span is an exported span with what the checks read of it.
type span struct {
	trace, id, parent string
	name              string
	start, end        time.Time
	attrs             map[string]string
	failed            bool
}

func newOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	r := &otlpReceiver{services: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if err := r.receive(req); err != nil {
			r.mu.Lock()
			r.bad = append(r.bad, err.Error())
			r.mu.Unlock()
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL
}

func (r *otlpReceiver) receive(req *http.Request) error {
	if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		return fmt.Errorf("%s %s (%s): want a POST of protobuf to /v1/traces", req.Method, req.URL.Path, req.Header.Get("Content-Type"))
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			return err
		}
		body = gz
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return err
	}
	var export coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(data, &export); err != nil {
		return fmt.Errorf("not an ExportTraceServiceRequest: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range export.ResourceSpans {
		for k, v := range attrMap(rs.GetResource().GetAttributes()) {
			if k == "service.name" {
				r.services[v] = true
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, &span{
					trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId), parent: hex.EncodeToString(s.ParentSpanId),
					name: s.Name, attrs: attrMap(s.Attributes), failed: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
					start: time.Unix(0, int64(s.StartTimeUnixNano)), end: time.Unix(0, int64(s.EndTimeUnixNano)),
				})
			}
		}
	}
	return nil
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.Value.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = fmt.Sprint(v.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.Key] = fmt.Sprint(v.BoolValue)
		default:
			m[kv.Key] = kv.Value.String()
		}
	}
	return m
}

// TestTracesFollowTheRollout: with OTEL_EXPORTER_OTLP_ENDPOINT set, the
// services export, over OTLP/HTTP, one trace per rollout whose spans form
// one tree, whatever service (or process) made them: the rollout at the
// root, its episodes under it, their turns under them, and under each turn
// its plan generation, its plan parsing and its acts, every act with its
// attempts and the actor-gateway's generation and engine call below them,
// each with the attributes that say where it is in the rollout.
func TestTracesFollowTheRollout(t *testing.T) {
	recv, url := newOTLPReceiver(t)
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SERVICE_NAME": "planact-e2e"}
	tracing, err := telemetry.StartTracing(context.Background(), func(k string) string { return env[k] }, "planact")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tracing.Shutdown(context.Background()) })
	if !tracing.Config.On || tracing.Config.Endpoint != url+"/v1/traces" {
		t.Fatalf("tracing %+v: want it on, posting to %s/v1/traces", tracing.Config, url)
	}
	e := start(t, envOptions{planner: sim.Config{Seed: 21, PlannerStepwise: 0.5}, actor: sim.Config{Seed: 22}, tracing: tracing})
	planner, actor := e.trainer(t), e.trainer(t)
	// A rollout's span is recorded after its results went out, just before
	// its "finished" status: the trainers may have their results earlier.
	finished := make(chan int64, 16)
	sub, err := bustest.Conn(t, e.url).Subscribe("rollout.*.status", func(m *nats.Msg) {
		var st schema.Status
		if schema.Unmarshal(m.Data, &st) == nil && st.Event == "finished" {
			finished <- st.Rollout
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	results := map[int64]outcome{}
	for n := int64(1); n <= 2; n++ {
		tasks := e.tasks(2, 2, n)
		o := e.rollout(t, planner, actor, n, tasks, nil, false)
		checkResults(t, n, tasks, o, false)
		results[n] = o
	}
	for range results {
		select {
		case <-finished:
		case <-time.After(time.Minute):
			t.Fatal("the rollouts' finished statuses never came")
		}
	}
	// The stack's shutdown exports what is still buffered: every span of
	// the finished rollouts is at the receiver once it returns.
	e.stop()

	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.bad) > 0 {
		t.Fatalf("the receiver refused exports: %v", recv.bad)
	}
	if !recv.services["planact-e2e"] {
		t.Errorf("service names %v: want OTEL_SERVICE_NAME's planact-e2e", recv.services)
	}
	byTrace := map[string][]*span{}
	for _, s := range recv.spans {
		byTrace[s.trace] = append(byTrace[s.trace], s)
	}
	if len(byTrace) != len(results) {
		t.Errorf("%d traces for %d rollouts", len(byTrace), len(results))
	}
	for n, o := range results {
		spans := byTrace[bus.RolloutTraceID(n)]
		if len(spans) == 0 {
			t.Errorf("rollout %d: no spans in its trace %s", n, bus.RolloutTraceID(n))
			continue
		}
		checkTree(t, n, spans, o)
	}
}

// checkTree checks the spans of rollout n's trace.
func checkTree(t *testing.T, n int64, spans []*span, o outcome) {
	t.Helper()
	byID := map[string]*span{}
	byName := map[string][]*span{}
	for _, s := range spans {
		if byID[s.id] != nil {
			t.Errorf("rollout %d: two spans with id %s: %s and %s", n, s.id, byID[s.id].name, s.name)
		}
		byID[s.id] = s
		byName[s.name] = append(byName[s.name], s)
	}
	// One tree: a single root, the rollout, and every other span's parent
	// in the trace.
	for _, s := range spans {
		if s.parent == "" {
			if s.name != "rollout" {
				t.Errorf("rollout %d: span %q is a root", n, s.name)
			}
			continue
		}
		if byID[s.parent] == nil {
			t.Errorf("rollout %d: span %q %v has parent %s, which is not in the trace", n, s.name, s.attrs, s.parent)
		}
		if s.end.Before(s.start) {
			t.Errorf("rollout %d: span %q ends before it starts", n, s.name)
		}
	}
	roots := byName["rollout"]
	if len(roots) != 1 {
		t.Fatalf("rollout %d: %d rollout spans, want 1", n, len(roots))
	}
	root := roots[0]
	want(t, root, "planact.rollout", fmt.Sprint(n))
	want(t, root, "planact.status", schema.ResultOK)
	want(t, root, "planact.planner.weight_version", "planner-v7")
	want(t, root, "planact.actor.weight_version", "actor-v3")

	status := map[string]string{} // of each episode, as its sample says
	for _, sample := range o.planner.Samples {
		status[sample.RolloutID[strings.LastIndex(sample.RolloutID, "-")+1:]] = sample.Status
	}
	episodes := map[string]*span{}
	for _, s := range byName["episode"] {
		under(t, s, root)
		want(t, s, "planact.rollout", fmt.Sprint(n))
		want(t, s, "planact.status", status[s.attrs["planact.episode"]])
		within(t, s, root)
		if episodes[s.attrs["planact.episode"]] != nil {
			t.Errorf("rollout %d: episode %s has two spans", n, s.attrs["planact.episode"])
		}
		episodes[s.attrs["planact.episode"]] = s
	}
	if len(episodes) != len(o.planner.Samples) {
		t.Errorf("rollout %d: %d episode spans for %d episodes", n, len(episodes), len(o.planner.Samples))
	}

	turns := map[string]*span{} // "episode/turn"
	for _, s := range byName["turn"] {
		ep := episodes[s.attrs["planact.episode"]]
		if ep == nil {
			t.Errorf("rollout %d: turn %v of no episode span", n, s.attrs)
			continue
		}
		under(t, s, ep)
		within(t, s, ep)
		want(t, s, "planact.rollout", fmt.Sprint(n))
		want(t, s, "planact.role", schema.RolePlanner)
		want(t, s, "planact.weight_version", "planner-v7")
		turns[s.attrs["planact.episode"]+"/"+s.attrs["planact.turn"]] = s
	}
	for _, sample := range o.planner.Samples {
		ep := sample.RolloutID[strings.LastIndex(sample.RolloutID, "-")+1:]
		for turn := 1; turn <= asInt(sample.Metadata["turns"]); turn++ {
			if turns[fmt.Sprintf("%s/%d", ep, turn)] == nil {
				t.Errorf("rollout %d: episode %s turn %d has no span", n, ep, turn)
			}
		}
	}
	turnOf := func(s *span) *span {
		tu := turns[s.attrs["planact.episode"]+"/"+s.attrs["planact.turn"]]
		if tu == nil {
			t.Errorf("rollout %d: %s %v names no turn with a span", n, s.name, s.attrs)
			return nil
		}
		under(t, s, tu)
		return tu
	}
	for _, name := range []string{"plan generation", "plan parsing"} {
		if len(byName[name]) < len(turns) {
			t.Errorf("rollout %d: %d %q spans for %d turns", n, len(byName[name]), name, len(turns))
		}
		for _, s := range byName[name] {
			turnOf(s)
		}
	}
	for _, s := range byName["planner engine"] {
		under(t, s, byID[s.parent])
		if p := byID[s.parent]; p != nil && p.name != "plan generation" {
			t.Errorf("rollout %d: planner engine span under %q", n, p.name)
		}
		want(t, s, "planact.weight_version", "planner-v7")
	}

	acts := map[string]*span{} // "episode/node"
	for _, s := range byName["act"] {
		if tu := turnOf(s); tu != nil {
			within(t, s, tu)
		}
		want(t, s, "planact.rollout", fmt.Sprint(n))
		want(t, s, "planact.role", schema.RoleActor)
		switch s.attrs["planact.status"] {
		case schema.ActDoneOK:
			want(t, s, "planact.weight_version", "actor-v3")
		case schema.ActFailed:
			if !s.failed || s.attrs["planact.error_kind"] == "" {
				t.Errorf("rollout %d: failed act without error status or kind: %v", n, s.attrs)
			}
		default:
			t.Errorf("rollout %d: act status %q", n, s.attrs["planact.status"])
		}
		if s.attrs["planact.replica"] == "" || s.attrs["planact.node"] == "" {
			t.Errorf("rollout %d: act span without replica or node: %v", n, s.attrs)
		}
		acts[s.attrs["planact.episode"]+"/"+s.attrs["planact.node"]] = s
	}
	for _, sample := range o.actor.Samples {
		ep := sample.RolloutID[strings.LastIndex(sample.RolloutID, "-")+1:]
		if acts[fmt.Sprintf("%s/%v", ep, sample.Metadata["key"])] == nil {
			t.Errorf("rollout %d: act %s/%v has a sample but no span", n, ep, sample.Metadata["key"])
		}
	}
	if len(acts) == 0 {
		t.Errorf("rollout %d: no act spans", n)
	}
	// Below an act: its attempts, each with the generation it asked the
	// actor-gateway for, and that generation's engine call.
	for _, chain := range [][2]string{{"act attempt", "act"}, {"actor generation", "act attempt"}, {"actor engine", "actor generation"}} {
		if len(byName[chain[0]]) < len(acts) {
			t.Errorf("rollout %d: %d %q spans for %d acts", n, len(byName[chain[0]]), chain[0], len(acts))
		}
		for _, s := range byName[chain[0]] {
			if p := byID[s.parent]; p == nil || p.name != chain[1] {
				t.Errorf("rollout %d: %q span not under an %q span", n, chain[0], chain[1])
			} else if chain[0] != "actor generation" {
				// (The actor-gateway ends its span after its reply,
				// which may be after the attempt's: not compared.)
				within(t, s, p)
			}
		}
	}
	for _, s := range byName["actor generation"] {
		if attempt := byID[s.parent]; attempt != nil {
			if act := byID[attempt.parent]; act != nil && act.attrs["planact.node"] != s.attrs["planact.node"] {
				t.Errorf("rollout %d: the generation for node %s is under the act of node %s", n, s.attrs["planact.node"], act.attrs["planact.node"])
			}
		}
	}
}

func want(t *testing.T, s *span, key, value string) {
	t.Helper()
	if s.attrs[key] != value {
		t.Errorf("span %q: %s = %q, want %q (attributes %v)", s.name, key, s.attrs[key], value, s.attrs)
	}
}

func under(t *testing.T, s, parent *span) {
	t.Helper()
	switch {
	case parent == nil:
		t.Errorf("span %q %v: its parent %s is not in the trace", s.name, s.attrs, s.parent)
	case s.parent != parent.id:
		t.Errorf("span %q %v: parent %s, want the %q span %s %v", s.name, s.attrs, s.parent, parent.name, parent.id, parent.attrs)
	}
}

// within checks that s lies in its parent's time, give or take the
// millisecond that times recorded in planact's state are rounded to.
func within(t *testing.T, s, parent *span) {
	t.Helper()
	const slack = time.Millisecond
	if s.start.Before(parent.start.Add(-slack)) || s.end.After(parent.end.Add(slack)) {
		t.Errorf("span %q %v [%s, %s] is not within its parent %q [%s, %s]", s.name, s.attrs,
			s.start.Format(time.StampMicro), s.end.Format(time.StampMicro), parent.name, parent.start.Format(time.StampMicro), parent.end.Format(time.StampMicro))
	}
}
