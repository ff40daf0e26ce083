package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/natsbin"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// TestConnectionSettingsCheckedFirst: every command that connects takes
// the connection flags and variables, and reports a mistake in them,
// naming the flag or variable, before it tries to connect (to a port
// where nothing listens: a connection error would mean it tried).
func TestConnectionSettingsCheckedFirst(t *testing.T) {
	ca := bustest.NewPKI(t, "planact")
	cert, _ := ca.Client("trainer")
	commands := map[string][]string{
		"serve":   {"serve", "actor-gateway"},
		"submit":  {"submit", "--rollout", "1", "--role", "actor", "--actor-engine", "http://127.0.0.1:1"},
		"watch":   {"watch", "7"},
		"inspect": {"inspect", "7"},
		"up":      {"up", "--metrics", ""},
	}
	for name, args := range commands {
		for _, tc := range []struct {
			name  string
			extra []string
			env   func(string) string
			err   string
		}{
			{"cert without key", []string{"--nats", "nats://127.0.0.1:1", "--tls-cert", cert}, noenv, "nats: --tls-cert without --tls-key"},
			{"password without user", nil, env("NATS_URL", "nats://127.0.0.1:1", "NATS_PASSWORD", "pw"), "nats: $NATS_PASSWORD without $NATS_USER"},
			{"missing CA", []string{"--tls-ca", "/nonexistent/ca.pem"}, env("NATS_URL", "nats://127.0.0.1:1"), "nats: --tls-ca /nonexistent/ca.pem: open /nonexistent/ca.pem"},
			{"two ways", []string{"--nats", "nats://127.0.0.1:1", "--creds", "/nonexistent/u.creds"}, env("NATS_TOKEN", "t"), "nats: --creds and $NATS_TOKEN: give one way to authenticate"},
		} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				var out bytes.Buffer
				// Flags go right after the command, before positional arguments.
				argv := append(append([]string{args[0]}, tc.extra...), args[1:]...)
				err := run(ctx, argv, tc.env, strings.NewReader(""), &out, &out)
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Errorf("error %v, want one starting %q", err, tc.err)
				}
			})
		}
	}
}

// TestUpFlags: the embedded server's own flags are checked before it
// starts, and a bad --sync names the flag.
func TestUpFlags(t *testing.T) {
	ca := bustest.NewPKI(t, "planact")
	srvCert, srvKey := ca.Server("nats")
	creds := filepath.Join(t.TempDir(), "u.creds")
	os.WriteFile(creds, []byte("not read: the check comes first"), 0o600)
	for _, tc := range []struct {
		name string
		args []string
		env  func(string) string
		err  string
	}{
		{"sync for another server", []string{"--nats", "nats://127.0.0.1:1", "--sync", "1s"}, noenv,
			"up: --port, --sync set the embedded server, but --nats names another one (nats://127.0.0.1:1): leave --nats out to start the embedded server, or leave --port, --sync out to use that one"},
		{"TLS for another server", []string{"--tls-server-cert", srvCert, "--tls-server-key", srvKey}, env("NATS_URL", "nats://127.0.0.1:1"),
			"up: --port, --tls-server-cert, --tls-server-key set the embedded server, but $NATS_URL names another one (nats://127.0.0.1:1): unset NATS_URL to start the embedded server"},
		// --port used to be ignored without a word when $NATS_URL was set.
		{"port for another server", nil, env("NATS_URL", "nats://u:secret@127.0.0.1:1"),
			"up: --port set the embedded server, but $NATS_URL names another one (nats://u:xxxxx@127.0.0.1:1): unset NATS_URL to start the embedded server, or leave --port out to use that one"},
		{"data and host for another server", []string{"--nats", "nats://127.0.0.1:1", "--data", "/tmp/x", "--host", "0.0.0.0"}, env("NATS_URL", "nats://127.0.0.1:2"),
			"up: --data, --host, --port set the embedded server, but --nats names another one (nats://127.0.0.1:1): leave --nats out and unset NATS_URL to start"},
		{"monitoring for another server", []string{"--nats", "nats://127.0.0.1:1", "--monitor-port", "-1"}, noenv,
			"up: --monitor-port, --port set the embedded server, but --nats names another one (nats://127.0.0.1:1)"},
		{"bad sync", []string{"--sync", "often"}, noenv, `invalid value "often" for flag -sync: want always or a positive duration`},
		{"zero sync", []string{"--sync", "0s"}, noenv, `invalid value "0s" for flag -sync`},
		{"nkey file missing", nil, env("NATS_NKEY", "/nonexistent"), "nats: $NATS_NKEY /nonexistent: open"},
		{"token for the embedded server", nil, env("NATS_TOKEN", "t"), "up: $NATS_TOKEN is for an external server (--nats or $NATS_URL); the embedded server has no users"},
		{"server cert without key", []string{"--tls-server-cert", srvCert}, noenv, "up: --tls-server-cert and --tls-server-key go together"},
		{"client CA without server cert", []string{"--tls-server-ca", ca.CA}, noenv, "up: --tls-server-ca needs --tls-server-cert"},
		{"client CA, no cert for planact", []string{"--tls-server-cert", srvCert, "--tls-server-key", srvKey, "--tls-server-ca", ca.CA}, noenv,
			"up: with --tls-server-ca the embedded server verifies clients: give --tls-cert and --tls-key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			args := append([]string{"up", "--port", "-1", "--metrics", ""}, tc.args...)
			err := run(context.Background(), args, tc.env, strings.NewReader(""), &out, &out)
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("error %v, want one starting %q", err, tc.err)
			}
		})
	}
}

// TestUpDemoOverMutualTLS: `up` serves TLS on its embedded server,
// requires client certificates, and its services and trainers connect
// with theirs; writes are flushed before they are acknowledged.
func TestUpDemoOverMutualTLS(t *testing.T) {
	ca := bustest.NewPKI(t, "planact")
	srvCert, srvKey := ca.Server("nats")
	cliCert, cliKey := ca.Client("planact")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	var stderr syncBuffer
	err := run(ctx, []string{"up", "--demo", "--json", "--port", "-1", "--metrics", "", "--data", t.TempDir(), "--sync", "always",
		"--tls-server-cert", srvCert, "--tls-server-key", srvKey, "--tls-server-ca", ca.CA,
		"--tls-ca", ca.CA, "--tls-cert", cliCert, "--tls-key", cliKey,
		"--rollouts", "1", "--tasks", "2", "--samples-per-prompt", "1", "--sim-ttft", "0", "--sim-per-token", "0"},
		noenv, strings.NewReader(""), &stdout, &stderr)
	if err != nil {
		t.Fatalf("up --demo over mutual TLS: %v\nstderr:\n%s", err, stderr.String())
	}
	var sum demo.Summary
	if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout.String())
	}
	if sum.RolloutsCompleted != 1 || sum.Episodes != 2 || sum.PlannerSamples != 2 {
		t.Errorf("rollouts %d, episodes %d, planner samples %d; want 1, 2, 2", sum.RolloutsCompleted, sum.Episodes, sum.PlannerSamples)
	}
}

// TestUpOverTLSTrustsItsCertificate: without --tls-ca, planact's own
// clients take the embedded server's certificate as their root.
func TestUpOverTLSTrustsItsCertificate(t *testing.T) {
	ca := bustest.NewPKI(t, "planact")
	srvCert, srvKey := ca.Server("nats")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	var stderr syncBuffer
	err := run(ctx, []string{"up", "--demo", "--json", "--port", "-1", "--metrics", "", "--data", t.TempDir(),
		"--tls-server-cert", srvCert, "--tls-server-key", srvKey,
		"--rollouts", "1", "--tasks", "1", "--samples-per-prompt", "1", "--sim-ttft", "0", "--sim-per-token", "0"},
		noenv, strings.NewReader(""), &stdout, &stderr)
	if err != nil {
		t.Fatalf("up --demo over TLS: %v\nstderr:\n%s", err, stderr.String())
	}
	var sum demo.Summary
	if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil || sum.RolloutsCompleted != 1 {
		t.Fatalf("summary %+v (%v)", sum, err)
	}
}

// TestCommandsRefuseAnOldServer: against Debian's nats-server (2.9, older
// than planact needs) every command stops at once with one line naming the
// server's version and the one planact needs. `serve session-store`
// retried provisioning ("limit marker TTLs not supported by server") and
// `submit` waited for both roles until its time-out.
func TestCommandsRefuseAnOldServer(t *testing.T) {
	old := natsbin.Old(t)
	want := "nats-server too old for planact: " + old.URL + " runs " + old.Version + ", planact needs 2.12.0 or later"
	for _, args := range [][]string{
		{"serve", "--nats", old.URL, "session-store"},
		{"serve", "--nats", old.URL, "act-dispatcher", "actor-gateway"},
		{"up", "--nats", old.URL, "--metrics", ""},
		{"submit", "--nats", old.URL, "--rollout", "1", "--planner-engine", "http://127.0.0.1:1", "--actor-engine", "http://127.0.0.1:1", "--sim-tasks", "1"},
		{"watch", "--nats", old.URL, "1"},
		{"watch", "-v", "--nats", old.URL},
		{"inspect", "--nats", old.URL, "1"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var out syncBuffer
		err := run(ctx, args, noenv, strings.NewReader(""), &out, &out)
		late := ctx.Err()
		cancel()
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") || late != nil {
			t.Errorf("planact %s: %v, want one line saying %q", strings.Join(args, " "), err, want)
		}
		if strings.Contains(out.String(), "retrying") {
			t.Errorf("planact %s retried:\n%s", strings.Join(args, " "), out.String())
		}
	}
}
