package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
	actorgateway "github.com/planact/planact/services/actor-gateway"
)

// These tests look at planact the way an operator with the nats CLI does:
// `nats micro ls|info|stats`, `nats sub --headers-only`, `nats sub
// --translate 'planact decode'` and `nats trace`, speaking the protocols
// the CLI speaks with nats.go, to check their details; nats_cli_real_test.go
// runs the real CLI.

// patience bounds how long a test waits for something that should happen
// long before; it is a hang guard, not a performance assertion.
const patience = 60 * time.Second

// gather sends a request to subj and collects every reply that arrives
// until the replies go quiet, as `nats req --replies 0` does.
func gather(t *testing.T, nc *nats.Conn, subj string) []*nats.Msg {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subj, inbox, nil); err != nil {
		t.Fatal(err)
	}
	var out []*nats.Msg
	for {
		m, err := sub.NextMsg(300 * time.Millisecond)
		if err != nil {
			return out
		}
		out = append(out, m)
	}
}

// serviceReplies asks subj until every name in want has answered as many
// times as want says (services and their replicas register as they start)
// and returns the answers by service name.
func serviceReplies[T any](t *testing.T, nc *nats.Conn, subj string, want map[string]int, name func(T) string) map[string][]T {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		got := map[string][]T{}
		for _, m := range gather(t, nc, subj) {
			var v T
			if err := json.Unmarshal(m.Data, &v); err != nil {
				t.Fatalf("%s reply %q: %v", subj, m.Data, err)
			}
			got[name(v)] = append(got[name(v)], v)
		}
		var missing []string
		for s, n := range want {
			if len(got[s]) < n {
				missing = append(missing, s)
			}
		}
		sort.Strings(missing)
		if len(missing) == 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no answer from %v (answered: %v)", subj, missing, keys(got))
		}
	}
}

// replicas wants one answer from each service, and more where more says.
func replicas(more map[string]int) map[string]int {
	want := map[string]int{}
	for _, s := range stack.Services {
		want[s] = 1
	}
	for s, n := range more {
		want[s] = n
	}
	return want
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestMicroServices: `nats micro ls` lists every planact service, `nats
// micro info` shows their endpoints and `nats micro stats` counts requests.
func TestMicroServices(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{replicas: map[string]int{actorgateway.Name: 2}})
	nc := bustest.Conn(t, e.url)

	pings := serviceReplies(t, nc, "$SRV.PING", replicas(map[string]int{actorgateway.Name: 2}), func(p micro.Ping) string { return p.Name })
	for _, name := range stack.Services {
		for _, p := range pings[name] {
			if p.Type != micro.PingResponseType || p.ID == "" || p.Version == "" {
				t.Errorf("%s: ping %+v", name, p)
			}
		}
	}
	if n := len(pings[actorgateway.Name]); n != 2 {
		t.Errorf("actor-gateway: %d replicas answered $SRV.PING, want 2", n)
	}
	// A name narrows the ping to one service, as `nats micro ping actor-gateway`.
	for _, m := range gather(t, nc, "$SRV.PING."+actorgateway.Name) {
		var p micro.Ping
		if err := json.Unmarshal(m.Data, &p); err != nil || p.Name != actorgateway.Name {
			t.Errorf("$SRV.PING.%s answered by %q (%v)", actorgateway.Name, p.Name, err)
		}
	}

	infos := serviceReplies(t, nc, "$SRV.INFO", replicas(nil), func(i micro.Info) string { return i.Name })
	for _, name := range stack.Services {
		for _, i := range infos[name] {
			if i.Description == "" || len(i.Endpoints) == 0 {
				t.Errorf("%s: info without description or endpoints: %+v", name, i)
			}
		}
	}
	ag := infos[actorgateway.Name][0]
	if ep := ag.Endpoints[0]; ep.Subject != schema.ActorSubject || ep.QueueGroup != actorgateway.QueueGroup || ep.Metadata["schema"] != "actor.generate/1" {
		t.Errorf("actor-gateway endpoint %+v: want subject %s, queue group %s, schema metadata", ep, schema.ActorSubject, actorgateway.QueueGroup)
	}

	// After a rollout the actor-gateway replicas have served requests.
	planner, actor := e.trainer(t), e.trainer(t)
	o := e.rollout(t, planner, actor, 7, e.tasks(2, 1, 7), nil, false)
	if o.perr != nil || o.aerr != nil {
		t.Fatalf("rollout: %v, %v", o.perr, o.aerr)
	}
	if raceEnabled() {
		// nats.go micro (v1.55.0) writes the service's start time after it
		// subscribes the $SRV handlers and reads it unlocked in Stats: the
		// race detector flags every $SRV.STATS. Checked without -race.
		t.Log("$SRV.STATS not checked under -race (nats.go micro data race)")
		return
	}
	stats := serviceReplies(t, nc, "$SRV.STATS", replicas(map[string]int{actorgateway.Name: 2}), func(s micro.Stats) string { return s.Name })
	served := 0
	for _, s := range stats[actorgateway.Name] {
		if s.Type != micro.StatsResponseType {
			t.Errorf("stats type %q", s.Type)
		}
		for _, ep := range s.Endpoints {
			served += ep.NumRequests
		}
	}
	if served == 0 {
		t.Errorf("actor-gateway stats count no requests after a rollout: %+v", stats[actorgateway.Name])
	}
}

func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// waitServices returns once every planact service answers $SRV.PING, that
// is once they have all connected and provisioned.
func waitServices(t *testing.T, nc *nats.Conn) {
	t.Helper()
	serviceReplies(t, nc, "$SRV.PING", replicas(nil), func(p micro.Ping) string { return p.Name })
}

// captured is one message seen by a plain subscription.
type captured struct {
	subject string
	header  nats.Header
	data    []byte
}

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`)

// TestHeadersAndDecode follows a rollout with plain subscriptions, like
// `nats sub --headers-only 'act.>'`, and checks that every message says what
// it is in its headers, that its body decodes to JSON (`planact decode`)
// that validates against its schema, and that one trace id spans it all.
func TestHeadersAndDecode(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 5, PlannerStepwise: 0.5}, actor: sim.Config{Seed: 6}})
	nc := bustest.Conn(t, e.url)
	const n = 31
	var (
		mu   sync.Mutex
		msgs []captured
	)
	for _, filter := range []string{fmt.Sprintf("rollout.%d.>", n), fmt.Sprintf("plan.%d.>", n), fmt.Sprintf("act.%d.>", n), schema.ActorSubject} {
		_, err := nc.Subscribe(filter, func(m *nats.Msg) {
			mu.Lock()
			defer mu.Unlock()
			msgs = append(msgs, captured{subject: m.Subject, header: m.Header, data: m.Data})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// Both trainers bring the same trace id (one derived from the rollout
	// id would do), so even the arrivals belong to the rollout's trace.
	trace := bus.NewTraceID()
	ctx, cancel := context.WithTimeout(bus.WithTrace(context.Background(), trace), 2*time.Minute)
	defer cancel()
	planner, actor := e.trainer(t), e.trainer(t)
	tasks := e.tasks(3, 1, n)
	if err := planner.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, WeightVersion: "planner-v7", Tasks: tasks}); err != nil {
		t.Fatal(err)
	}
	if err := actor.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.actor, WeightVersion: "actor-v3"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		role string
		wait func(context.Context, int64, string, ...client.ResultOption) (*schema.Result, error)
	}{{schema.RolePlanner, planner.Result}, {schema.RoleActor, actor.Result}} {
		r, err := c.wait(ctx, n, c.role)
		if err != nil || r.Status != schema.ResultOK {
			t.Fatalf("%s result: %v %+v", c.role, err, r)
		}
	}
	// The results are published last but core delivery is asynchronous:
	// wait until this connection has seen both.
	results := func() int {
		mu.Lock()
		defer mu.Unlock()
		k := 0
		for _, m := range msgs {
			if strings.HasPrefix(m.subject, fmt.Sprintf("rollout.%d.result.", n)) {
				k++
			}
		}
		return k
	}
	for deadline := time.Now().Add(patience); results() < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the plain subscription never saw both results")
		}
		time.Sleep(10 * time.Millisecond)
	}

	schemas := compileSchemas(t)
	mu.Lock()
	seen := slices.Clone(msgs)
	mu.Unlock()
	kinds := map[string]int{}
	for _, m := range seen {
		kind := m.header.Get(schema.HdrSchema)
		kinds[kind]++
		checkHeaders(t, m, n, trace)
		checkDecode(t, m, kind, schemas)
	}
	for _, want := range []string{
		"rollout.arrive/1", "rollout.start/1", "rollout.status/1", "rollout.timeout/1", "plan.req/1", "plan.out/1",
		"plan.dag/1", "plan.answer/1", "act.done/1", "actor.generate/1", "rollout.end/1", "rollout.result/1",
	} {
		if kinds[want] == 0 {
			t.Errorf("no %s message seen (seen: %v)", want, kinds)
		}
	}
	t.Logf("%d messages checked: %v", len(seen), kinds)
}

func checkHeaders(t *testing.T, m captured, n int64, trace string) {
	t.Helper()
	h := m.header
	where := fmt.Sprintf("%s [%s]", m.subject, h.Get(schema.HdrSchema))
	if h.Get(schema.HdrSchema) == "" {
		t.Errorf("%s: no %s header", where, schema.HdrSchema)
	}
	if got := h.Get(schema.HdrContentType); got != schema.ContentType {
		t.Errorf("%s: Content-Type %q", where, got)
	}
	if got := h.Get(schema.HdrRollout); got != strconv.FormatInt(n, 10) {
		t.Errorf("%s: %s %q, want %d", where, schema.HdrRollout, got, n)
	}
	tp := traceparentRE.FindStringSubmatch(h.Get(schema.HdrTraceparent))
	switch {
	case tp == nil:
		t.Errorf("%s: traceparent %q is not W3C", where, h.Get(schema.HdrTraceparent))
	case tp[1] != trace:
		t.Errorf("%s: trace id %s, the rollout's is %s", where, tp[1], trace)
	}
	if m.subject == schema.ActorSubject {
		// A request on a service endpoint, not a stream: no Nats-Msg-Id.
		if h.Get(schema.HdrNode) == "" || h.Get(schema.HdrEpisode) == "" {
			t.Errorf("%s: no episode or node header: %v", where, h)
		}
		return
	}
	if h.Get(jetstream.MsgIDHeader) == "" {
		t.Errorf("%s: no Nats-Msg-Id", where)
	}
	p, err := subject.Parse(m.subject)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	if p.Episode >= 0 && h.Get(schema.HdrEpisode) != strconv.Itoa(p.Episode) {
		t.Errorf("%s: %s %q, subject says %d", where, schema.HdrEpisode, h.Get(schema.HdrEpisode), p.Episode)
	}
	if p.Node != "" && h.Get(schema.HdrNode) != p.Node {
		t.Errorf("%s: %s %q, subject says %s", where, schema.HdrNode, h.Get(schema.HdrNode), p.Node)
	}
	if p.Role != "" && h.Get(schema.HdrRole) != p.Role {
		t.Errorf("%s: %s %q, subject says %s", where, schema.HdrRole, h.Get(schema.HdrRole), p.Role)
	}
	if (p.Domain == "plan" || p.Domain == "act") && h.Get(schema.HdrTurn) == "" {
		t.Errorf("%s: no %s header", where, schema.HdrTurn)
	}
	if p.Verb == "arrive" && h.Get(schema.HdrRole) == "" {
		t.Errorf("%s: arrival without %s", where, schema.HdrRole)
	}
}

// checkDecode does what `nats sub --translate 'planact decode'` does with
// the body, and validates the JSON against the schema the header names.
func checkDecode(t *testing.T, m captured, kind string, schemas map[string]*jsonschema.Schema) {
	t.Helper()
	v, err := schema.ToJSONable(m.data)
	if err != nil {
		t.Errorf("%s: decode: %v", m.subject, err)
		return
	}
	js, err := json.Marshal(v)
	if err != nil {
		t.Errorf("%s: json: %v", m.subject, err)
		return
	}
	obj, _ := v.(map[string]any)
	if obj["schema"] != kind {
		t.Errorf("%s: body schema %v, header %s", m.subject, obj["schema"], kind)
	}
	if hdrTurn := m.header.Get(schema.HdrTurn); hdrTurn != "" {
		if got := fmt.Sprint(obj["turn"]); got != hdrTurn {
			t.Errorf("%s: body turn %s, header %s", m.subject, got, hdrTurn)
		}
	}
	s := schemas[strings.Replace(kind, "/", ".v", 1)+".schema.json"]
	if s == nil {
		t.Errorf("%s: no schema file for %s", m.subject, kind)
		return
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(js)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(doc); err != nil {
		t.Errorf("%s: %s body does not validate:\n%v\n%.2000s", m.subject, kind, err, js)
	}
}

// compileSchemas loads schemas/ as pkg/schema's tests do.
func compileSchemas(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	const base = "https://planact.dev/schemas/"
	files, err := filepath.Glob("../schemas/*.schema.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no schemas: %v", err)
	}
	c := jsonschema.NewCompiler()
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(r)
		r.Close()
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if err := c.AddResource(base+filepath.Base(f), doc); err != nil {
			t.Fatal(err)
		}
	}
	out := map[string]*jsonschema.Schema{}
	for _, f := range files {
		s, err := c.Compile(base + filepath.Base(f))
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = s
	}
	return out
}

// TestMessageTrace: `nats trace plan.9.dag.0` — a message published
// with a Nats-Trace-Dest header makes the server report what it did with
// it (ingress, the stream that stored it, the subscriptions it reached).
// With Nats-Trace-Only the message goes nowhere; only the trace is made.
func TestMessageTrace(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{})
	nc := bustest.Conn(t, e.url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	waitServices(t, nc)
	st, err := js.Stream(ctx, bus.StreamRollout)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := nc.SubscribeSync("rollout.9.status")
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name      string
		msg       schema.Message
		stream    string
		traceOnly bool
	}{
		// Nothing consumes status events but people: safe to deliver.
		{"delivered", &schema.Status{Rollout: 9, Event: "traced", Episode: -1, AtMs: 1}, bus.StreamRollout, false},
		// A plan must not reach the act-dispatcher: trace only.
		{"trace-only", &schema.PlanDAG{Rollout: 9, Episode: 0, Turn: 1}, bus.StreamPlan, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dest := nats.NewInbox()
			traces, err := nc.SubscribeSync(dest)
			if err != nil {
				t.Fatal(err)
			}
			msg, err := bus.NewMsg(ctx, c.msg)
			if err != nil {
				t.Fatal(err)
			}
			msg.Header.Set("Nats-Trace-Dest", dest)
			if c.traceOnly {
				msg.Header.Set("Nats-Trace-Only", "true")
			}
			if err := nc.PublishMsg(msg); err != nil {
				t.Fatal(err)
			}
			tm, err := traces.NextMsg(patience)
			if err != nil {
				t.Fatalf("no trace event on %s: %v", dest, err)
			}
			var ev server.MsgTraceEvent
			if err := json.Unmarshal(tm.Data, &ev); err != nil {
				t.Fatalf("trace event %s: %v", tm.Data, err)
			}
			in := ev.Ingress()
			if in == nil || in.Subject != c.msg.Subject() || in.Error != "" {
				t.Fatalf("ingress %+v, want subject %s", in, c.msg.Subject())
			}
			if got := ev.Request.Header[schema.HdrSchema]; len(got) != 1 || got[0] != c.msg.Kind() {
				t.Errorf("the trace shows header %s %q, want %q", schema.HdrSchema, got, c.msg.Kind())
			}
			jsev := ev.JetStream()
			if jsev == nil || jsev.Stream != c.stream || jsev.Error != "" {
				t.Fatalf("jetstream event %+v, want stream %s", jsev, c.stream)
			}
			if c.traceOnly {
				return
			}
			if len(ev.Egresses()) == 0 {
				t.Error("no egress event for the plain subscription")
			}
			if _, err := watch.NextMsg(patience); err != nil {
				t.Errorf("the traced status was not delivered: %v", err)
			}
			if _, err := st.GetLastMsgForSubject(ctx, c.msg.Subject()); err != nil {
				t.Errorf("the traced status was not stored: %v", err)
			}
		})
	}
	// The trace-only plan reached no stream.
	plans, err := js.Stream(ctx, bus.StreamPlan)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plans.GetLastMsgForSubject(ctx, cases[1].msg.Subject()); err == nil {
		t.Error("a trace-only plan was stored in PLAN")
	}
}
