package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
)

// TestBadValuesAreRefused: a value that cannot be meant is refused with an
// error naming its flag or variable, before anything starts; each was
// taken for its default before (0 replicas, storage, history or result
// retention; an unknown log level or format; a limit of 0 or less), and
// serve --replicas -3 blamed --history.
func TestBadValuesAreRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  func(string) string
		want string
	}{
		{[]string{"provision", "--dry-run", "--replicas", "0"}, noenv, "provision: --replicas 0: want 1 to 5"},
		{[]string{"provision", "--dry-run", "--replicas", "7"}, noenv, "provision: --replicas 7: want 1 to 5"},
		{[]string{"provision", "--dry-run", "--storage", "0"}, noenv, `invalid value "0" for flag -storage: size "0": want at least 256 MiB`},
		{[]string{"provision", "--dry-run", "--storage", "0.5"}, noenv, `invalid value "0.5" for flag -storage`},
		{[]string{"provision", "--dry-run", "--history", "0"}, noenv, "provision: --history 0s: want at least 1s"},
		{[]string{"provision", "--dry-run", "--result-retention", "0"}, noenv, "provision: --result-retention 0s: want more than 0"},
		{[]string{"provision", "--dry-run", "--history", "1h", "--result-retention", "2h"}, noenv, "provision: --result-retention 2h: want more than 0 and at most --history (1h)"},
		{[]string{"provision", "--dry-run"}, env("PLANACT_LOG_LEVEL", "warning"), `provision: $PLANACT_LOG_LEVEL "warning": want debug, info, warn, error`},
		{[]string{"serve", "--engine-limit", "0", "actor-gateway"}, noenv, "serve: --engine-limit 0: want at least 1"},
		{[]string{"serve", "--engine-limit", "-5", "actor-gateway"}, noenv, "serve: --engine-limit -5: want at least 1"},
		{[]string{"serve", "--replicas", "-3", "actor-gateway"}, noenv, "serve: --replicas -3: want 1 to 5"},
		{[]string{"serve", "--replicas", "0", "actor-gateway"}, noenv, "serve: --replicas 0: want 1 to 5"},
		{[]string{"serve", "--history", "0", "actor-gateway"}, noenv, "--history 0s: want at least 1s"},
		{[]string{"serve", "actor-gateway"}, env("PLANACT_LOG_FORMAT", "prety"), `serve: $PLANACT_LOG_FORMAT "prety": want json or pretty`},
		{[]string{"serve", "actor-gateway"}, env("PLANACT_LOG_LEVEL", "verbose"), `serve: $PLANACT_LOG_LEVEL "verbose"`},
		{[]string{"up", "--port", "-1", "--metrics", "", "--log-level", "verbose"}, noenv, `up: --log-level "verbose": want debug, info, warn, error`},
		{[]string{"up", "--port", "-1", "--metrics", ""}, env("PLANACT_LOG_LEVEL", "warning"), `up: $PLANACT_LOG_LEVEL "warning"`},
		{[]string{"up", "--port", "-1", "--metrics", "", "--storage", "0"}, noenv, `invalid value "0" for flag -storage`},
		{[]string{"up", "--port", "-1", "--metrics", "", "--result-retention", "0"}, noenv, "--result-retention 0s"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out syncBuffer
		err := run(ctx, c.args, c.env, strings.NewReader(""), &out, &out)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
		if strings.Contains(out.String(), "NATS at") || strings.Contains(out.String(), "max bytes") {
			t.Errorf("%v did something before refusing its flags:\n%s", c.args, out.String())
		}
	}
	// What is meant still goes.
	var out syncBuffer
	if err := run(context.Background(), []string{"provision", "--dry-run", "--replicas", "3", "--storage", "1.5G", "--history", "2h", "--result-retention", "2h"},
		env("PLANACT_LOG_LEVEL", "WARN", "PLANACT_LOG_FORMAT", "pretty"), nil, &out, &out); err != nil {
		t.Errorf("provision with good values: %v\n%s", err, out.String())
	}
}

// TestProvisionAgainKeepsTheHistory: planact provision run again without
// --history lowered a longer history set before to the default, and
// JetStream removed at once what was older. It keeps it now; --history
// given sets it, and --shrink lowers it to the default.
func TestProvisionAgainKeepsTheHistory(t *testing.T) {
	_, url := bustest.Server(t)
	ctx := context.Background()
	maxAge := func() time.Duration {
		t.Helper()
		js, err := jetstream.New(bustest.Conn(t, url))
		if err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, bus.StreamRollout)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.Config.MaxAge
	}
	provision := func(args ...string) {
		t.Helper()
		var out syncBuffer
		if err := run(ctx, append([]string{"provision", "--nats", url}, args...), noenv, nil, &out, &out); err != nil {
			t.Fatalf("provision %v: %v\n%s", args, err, out.String())
		}
	}
	provision("--history", "72h")
	provision()
	if got := maxAge(); got != 72*time.Hour {
		t.Errorf("provisioned again without --history: ROLLOUT keeps %v; want the 72h set before", got)
	}
	provision("--history", "48h")
	if got := maxAge(); got != 48*time.Hour {
		t.Errorf("provisioned with --history 48h: %v", got)
	}
	provision("--shrink")
	if got := maxAge(); got != bus.DefaultProvisioning().History {
		t.Errorf("provisioned with --shrink: %v; want the default %v", got, bus.DefaultProvisioning().History)
	}
}

// TestBadTimesAndPortsAreRefused: a simulated time below zero, a negative
// concurrency or drift point, and a port no listener can have are refused
// naming their flag, before anything starts. Before, the times and counts
// were taken for none, and up --monitor-port -2 waited 10 s for its
// server, then blamed the client port.
func TestBadTimesAndPortsAreRefused(t *testing.T) {
	up := []string{"up", "--port", "-1", "--metrics", ""}
	sim := []string{"sim", "--planner-addr", "127.0.0.1:0", "--actor-addr", "127.0.0.1:0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(up, "--sim-ttft", "-1s"), "up: --sim-ttft -1s: want 0 or more"},
		{append(up, "--sim-per-token", "-2ms"), "up: --sim-per-token -2ms: want 0 or more"},
		{append(up, "--monitor-port", "-2"), "up: --monitor-port -2: want a port from 1 to 65535"},
		{[]string{"up", "--port", "70000", "--metrics", ""}, "up: --port 70000: want a port from 1 to 65535"},
		{[]string{"up", "--port", "-1", "--metrics", "nonsense"}, `up: --metrics "nonsense": want host:port`},
		{append(sim, "--ttft", "-1s"), "sim: --ttft -1s: want 0 or more"},
		{append(sim, "--per-token", "-1us"), "sim: --per-token -1µs: want 0 or more"},
		{append(sim, "--concurrency", "-1"), "sim: --concurrency -1"},
		{append(sim, "--drift-from", "-3"), "--drift-from -3: want 0 (none) or more"},
		// Flags that only change what another flag does, without it:
		// ignored before, the engines served, watch drew its board.
		{append(sim, "--samples-per-prompt", "4"), "sim: --samples-per-prompt 4: only with --tasks"},
		{[]string{"watch", "--nats", "nats://127.0.0.1:1", "--acts=false"}, "watch: --acts=false: only with -v"},
	} {
		// Ended already: a command that took its flags returns at once.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var out syncBuffer
		err := run(ctx, c.args, noenv, strings.NewReader(""), &out, &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
		if strings.Contains(out.String(), "NATS at") || strings.Contains(out.String(), "engine:") {
			t.Errorf("%v did something before refusing its flags:\n%s", c.args, out.String())
		}
	}
}
