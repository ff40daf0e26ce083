package main

import (
	"io"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/schema"
)

func TestKindOf(t *testing.T) {
	hdr := func(kv ...string) nats.Header {
		h := nats.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		m    *nats.Msg
		want string
	}{
		{&nats.Msg{Subject: "act.3.done.1.t1-a", Reply: "_INBOX.x.1"}, "publish ACT"},
		{&nats.Msg{Subject: "$KV.runs.3.1.1", Reply: "_INBOX.x.2"}, "publish KV_runs"},
		{&nats.Msg{Subject: "rollout.3.end.1", Reply: "_INBOX.x.3"}, "publish ROLLOUT"},
		{&nats.Msg{Subject: "rollout.3.status"}, "core publish to ROLLOUT (no ack asked)"},
		{&nats.Msg{Subject: schema.ActorSubject, Reply: "_INBOX.y.1"}, "core planact.actor"},
		{&nats.Msg{Subject: "_INBOX.x.1", Data: []byte(`{"stream":"ACT","seq":7}`)}, "reply: publish ack"},
		{&nats.Msg{Subject: "_INBOX.x.4", Reply: "$JS.ACK.PLAN.plan-parser.1.20.5.1700000000.0"}, "delivery PLAN/plan-parser"},
		{&nats.Msg{Subject: "_INBOX.x.5", Reply: "$JS.ACK.KV_sessions.3xTdNrVpXzGQk1rXk8d9pA.1.20.5.1700000000.0"}, "delivery KV_sessions/(ephemeral)"},
		{&nats.Msg{Subject: "$JS.ACK.PLAN.plan-parser.1.20.5.1700000000.0"}, "ack PLAN/plan-parser"},
		{&nats.Msg{Subject: "$JS.ACK.hub.abc.PLAN.planner-gateway.1.20.5.1700000000.0.x"}, "ack PLAN/planner-gateway"},
		{&nats.Msg{Subject: "$JS.API.CONSUMER.MSG.NEXT.PLAN.plan-parser", Reply: "_INBOX.z"}, "pull PLAN/plan-parser"},
		{&nats.Msg{Subject: "$JS.API.DIRECT.GET.ACT", Reply: "_INBOX.z"}, "direct get ACT"},
		{&nats.Msg{Subject: "$JS.API.STREAM.INFO.ACT", Reply: "_INBOX.z"}, "api STREAM.INFO"},
		{&nats.Msg{Subject: "_INBOX.z", Header: hdr("Nats-Stream", "ACT", "Nats-Subject", "act.3.done.1.t1-a")}, "reply: direct get of ACT"},
		{&nats.Msg{Subject: "_INBOX.z", Header: hdr("Status", "404")}, "reply: status 404"},
		{&nats.Msg{Subject: "_INBOX.z", Header: hdr("Status", "100")}, "reply: idle heartbeat"},
		{&nats.Msg{Subject: "_INBOX.y.1", Header: hdr(schema.HdrActorGateway, "g1", schema.HdrActorProgress, schema.ActorRunning)}, "reply: actor-gateway acknowledgement or progress"},
		{&nats.Msg{Subject: "_INBOX.y.1", Header: hdr(schema.HdrActorGateway, "g1"), Data: []byte{0x80}}, "reply: actor-gateway answer"},
		{&nats.Msg{Subject: "_INBOX.z", Data: []byte(`{"type":"io.nats.jetstream.api.v1.stream_info_response"}`)}, "reply: api reply"},
	} {
		if got := kindOf(tc.m); got != tc.want {
			t.Errorf("%s (reply %s, headers %v): %q, want %q", tc.m.Subject, tc.m.Reply, tc.m.Header, got, tc.want)
		}
	}
}

func TestTallyRowsMostFirst(t *testing.T) {
	rows := tallyRows(map[string]int64{"b": 10, "a": 10, "c": 30}, map[string]int64{"c": 20480}, 10)
	if len(rows) != 3 || rows[0].Kind != "c" || rows[0].PerAct != 3 || rows[0].KBPerAct != 2 || rows[1].Kind != "a" || rows[2].Kind != "b" || rows[2].KBPerAct != 0 {
		t.Errorf("rows %+v, want c (3 per act, 2 KB per act), then a and b", rows)
	}
}

func TestEnvFlagsNameEachVariable(t *testing.T) {
	o, err := parseOptions([]string{"-serve-env", "GOMAXPROCS=1 GOGC=200", "-nats-env", "GOMAXPROCS=1"}, io.Discard)
	if err != nil || strings.Join(o.ServeEnv, ",") != "GOMAXPROCS=1,GOGC=200" || strings.Join(o.NATSEnv, ",") != "GOMAXPROCS=1" {
		t.Fatalf("-serve-env %v, -nats-env %v: %v", o.ServeEnv, o.NATSEnv, err)
	}
	for _, flag := range []string{"-serve-env", "-nats-env"} {
		if _, err := parseOptions([]string{flag, "GOMAXPROCS=1 oops =1"}, io.Discard); err == nil ||
			!strings.Contains(err.Error(), flag+` "oops": want NAME=value`) || !strings.Contains(err.Error(), flag+` "=1": want NAME=value`) {
			t.Errorf("%s with words that are not NAME=value: %v, want an error naming each", flag, err)
		}
	}
}

// TestOneProcessRefusesWhatItCannotServe: -one-process runs one `planact
// up`, so replicas and a separate server's environment are refused,
// each named; -serve-env goes to that process.
// TestResultSamplesFlag: the step asks for results without the groups
// the trainers took, unless told otherwise; a value planact does not know
// is refused here, naming it, not by the first arrival.
func TestResultSamplesFlag(t *testing.T) {
	for args, want := range map[string]string{"": schema.ResultSamplesUndelivered, "-result-samples all": schema.ResultSamplesAll} {
		o, err := parseOptions(strings.Fields(args), io.Discard)
		if err != nil || o.ResultSamples != want || stepConfig(o).ResultSamples != want {
			t.Errorf("%q: result_samples %q (%v), want %q", args, o.ResultSamples, err, want)
		}
		if err := stepConfig(o).WithDefaults().Validate(); err != nil {
			t.Errorf("%q: the step's config is refused: %v", args, err)
		}
	}
	if _, err := parseOptions([]string{"-result-samples", "some"}, io.Discard); err == nil || !strings.Contains(err.Error(), `result_samples "some"`) {
		t.Errorf("-result-samples some: %v, want an error naming it", err)
	}
}

func TestOneProcessRefusesWhatItCannotServe(t *testing.T) {
	o, err := parseOptions([]string{"-one-process", "-serve-env", "GOMAXPROCS=1"}, io.Discard)
	if err != nil || !o.OneProcess || strings.Join(o.ServeEnv, ",") != "GOMAXPROCS=1" {
		t.Fatalf("-one-process -serve-env: %+v, %v", o, err)
	}
	_, err = parseOptions([]string{"-one-process", "-replicas", "act-dispatcher=2", "-nats-env", "GOMAXPROCS=1"}, io.Discard)
	for _, f := range []string{"-replicas", "-nats-env"} {
		if err == nil || !strings.Contains(err.Error(), f+": not with -one-process") {
			t.Errorf("-one-process with %s: %v, want an error naming it", f, err)
		}
	}
}
