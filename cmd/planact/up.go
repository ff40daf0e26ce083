package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/internal/web"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/telemetry"
)

// runUp starts everything in one process: an embedded nats-server, the five
// services and, unless engine URLs are given, simulated engines.
func runUp(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data", "", "JetStream data directory (default: a temporary directory, removed at exit)")
	host := fs.String("host", "127.0.0.1", "nats-server listen host")
	port := fs.Int("port", 4222, "nats-server listen port (-1 = any free port)")
	monitorPort := fs.Int("monitor-port", 0, "serve nats-server's monitoring endpoints (/varz, /connz, /jsz) on this port (0 = off, -1 = any free port)")
	var conn bus.ConnOptions
	conn.AddFlags(fs, "use this NATS server (URLs, comma-separated) instead of starting one (default $NATS_URL if set)")
	syncPolicy := embedded.Sync{Always: true}
	fs.Var(&syncPolicy, "sync", "when the embedded server flushes JetStream writes to disk: always (before acknowledging) or an interval such as 1s or 2m")
	serverCert := fs.String("tls-server-cert", "", "serve TLS on the embedded server with this certificate (PEM); needs --tls-server-key")
	serverKey := fs.String("tls-server-key", "", "private key (PEM) of --tls-server-cert")
	serverCA := fs.String("tls-server-ca", "", "require client certificates signed by these CAs (PEM) on the embedded server; planact's own connections use --tls-cert/--tls-key")
	plannerURL := fs.String("planner-url", "", "planner engine URL (default: start a simulated one)")
	actorURL := fs.String("actor-url", "", "actor engine URL (default: start a simulated one)")
	protocol := fs.String("protocol", "sglang", "engine protocol for --planner-url/--actor-url: "+strings.Join(engine.Protocols, ", "))
	runDemo := fs.Bool("demo", false, "play both trainers for a few rollouts, print progress and a summary, then exit")
	asJSON := fs.Bool("json", false, "with --demo: print the summary as one JSON object on stdout")
	rollouts := fs.Int("rollouts", 3, "with --demo: rollouts to play")
	tasks := fs.Int("tasks", 4, "with --demo: distinct tasks per rollout")
	group := fs.Int("samples-per-prompt", 2, "with --demo: copies of each task (a group)")
	format := fs.String("plan-format", "graph", "with --demo: plan format the planner is asked for (graph, tasklist, json, numbered, steps)")
	modeName := fs.String("mode", schema.ModePlanAct, "with --demo: coordination mode ("+strings.Join(schema.Modes, ", ")+"; docs/modes.md)")
	ensembleK := fs.Int("ensemble-k", 0, "with --demo --mode ensemble: candidates per act (2 to 16; default 3)")
	ensemblePick := fs.String("ensemble-pick", "", "with --demo --mode ensemble: who picks among the candidates ("+strings.Join(schema.EnsemblePicks, ", ")+"; default vote)")
	seed := fs.Int64("seed", 1, "seed of the simulated world and engines")
	latency := fs.Duration("sim-per-token", sim.Defaults.PerToken, "simulated time per generated token")
	ttft := fs.Duration("sim-ttft", sim.Defaults.TTFT, "simulated time to first token")
	actorErr := fs.Float64("sim-actor-error-rate", sim.Defaults.ActorErrorRate, "how often the simulated actor answers a lookup wrongly")
	stepwise := fs.Float64("sim-stepwise", sim.Defaults.PlannerStepwise, "fraction of questions the simulated planner plans one hop per turn")
	services := fs.String("services", strings.Join(stack.Services, ","), "services to run in this process (comma-separated; \"none\" for only NATS and engines)")
	metricsAddr := fs.String("metrics", "127.0.0.1:9464", "serve Prometheus /metrics on this address (\"\" = off)")
	pprofAddr := fs.String("pprof", "", "serve Go's runtime profiles (/debug/pprof/: CPU, heap, goroutines) of the whole process, the embedded server's included, on this address, e.g. 127.0.0.1:6060 (keep it on loopback)")
	webAddr := fs.String("web", "", "serve the web view of rollouts on this address, e.g. "+web.DefaultAddr+" (default off)")
	keep := retentionFlags(fs)
	storage := storageFlag(fs)
	logLevel := fs.String("log-level", "", "debug, info, warn or error (default: warn with --demo, else info; $PLANACT_LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Every flag is checked before anything starts.
	if fs.NArg() > 0 {
		return fmt.Errorf("up: unexpected arguments %q", fs.Args())
	}
	if !*runDemo {
		// Without --demo nothing plays the trainers: up --rollouts 10
		// served for ever and played none.
		var demoOnly []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "json", "rollouts", "tasks", "samples-per-prompt", "plan-format", "mode", "ensemble-k", "ensemble-pick":
				demoOnly = append(demoOnly, "--"+f.Name)
			}
		})
		if len(demoOnly) > 0 {
			return fmt.Errorf("up: %s: only with --demo (which plays the trainers); without it, trainers bring their own tasks and config", strings.Join(demoOnly, ", "))
		}
	}
	// up provisions in process, as the user it connects as (on the
	// embedded server, which has no users, anyone).
	so := stack.Options{Provision: true}
	if err := keep.apply(&so); err != nil {
		return err
	}
	so.Provisioning.Storage = storage.n
	if err := checkDemoMode(*modeName, *ensembleK, *ensemblePick); err != nil {
		return err
	}
	if err := checkDemoFlags(*rollouts, *tasks, *group, *format, *protocol, *actorErr, *stepwise); err != nil {
		return err
	}
	if err := checkUpFlags(*port, *monitorPort, *ttft, *latency, *metricsAddr); err != nil {
		return err
	}
	cfg := schema.DefaultConfig()
	cfg.PlanFormat = *format
	cfg.Mode, cfg.EnsembleK, cfg.EnsemblePick = *modeName, *ensembleK, *ensemblePick
	cfg = cfg.WithDefaults()
	// Seeded sampling: the same --seed plays the same demo.
	cfg.PlannerSampling.Seed, cfg.ActorSampling.Seed = seed, seed
	if life := schema.Seconds(cfg.BarrierTimeoutS + cfg.RolloutTimeoutS); *runDemo && life >= *keep.history {
		// The session-store refuses such a rollout (its session would be
		// gone before it timed out), and refused only the planner's
		// arrival, which brings the config: the demo's actor waited for
		// it until the demo's time-out, five minutes a rollout.
		return fmt.Errorf("up: --history %s: the demo's rollouts may run %s (barrier_timeout_s %g + rollout_timeout_s %g): want a longer history",
			shortDuration(*keep.history), shortDuration(life), cfg.BarrierTimeoutS, cfg.RolloutTimeoutS)
	}
	if (*plannerURL == "") != (*actorURL == "") && *runDemo {
		return errors.New("up: --planner-url and --actor-url go together (or neither, for simulated engines)")
	}
	for _, e := range []struct{ flag, url string }{{"--planner-url", *plannerURL}, {"--actor-url", *actorURL}} {
		if e.url == "" {
			continue
		}
		if err := checkEngineURL(e.flag, e.url); err != nil {
			return fmt.Errorf("up: %w", err)
		}
	}
	var names []string
	if *services != "none" && *services != "" {
		names = strings.Split(*services, ",")
		if err := stack.Validate(names); err != nil {
			return err
		}
	}
	switch {
	case *webAddr != "" && !slices.Contains(names, web.Name):
		names = append(names, web.Name)
	case *webAddr == "" && slices.Contains(names, web.Name):
		return fmt.Errorf("up: the %s service needs --web ADDR, e.g. --web %s", web.Name, web.DefaultAddr)
	}
	so.WebAddr = *webAddr
	lo, err := telemetry.LogOptionsFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	if err := telemetry.CheckLogLevel("--log-level", *logLevel); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	if *logLevel != "" {
		lo.Level = *logLevel
	}
	if lo.Level == "" && *runDemo {
		lo.Level = "warn"
	}
	log := telemetry.NewLogger(stderr, lo)
	tracing, err := telemetry.StartTracing(ctx, getenv, "planact")
	if err != nil {
		return err
	}
	defer tracing.Shutdown(context.Background()) // when no services ran; else the stack flushed it
	so.Tracing = tracing
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var monitorURL string
	natsFlag := conn.URL != ""
	external := natsFlag || getenv(bus.EnvURL) != ""
	conn, err = conn.Resolve(getenv)
	if err != nil {
		return err
	}
	if external {
		// The embedded server's settings would go unused: say so, and how
		// to have either.
		var unused []string
		fs.Visit(func(f *flag.Flag) {
			switch {
			case f.Name == "port", f.Name == "monitor-port", f.Name == "host", f.Name == "data", f.Name == "sync", strings.HasPrefix(f.Name, "tls-server-"):
				unused = append(unused, "--"+f.Name)
			}
		})
		if len(unused) > 0 {
			by, fix := "--nats", "leave --nats out"
			switch env := getenv(bus.EnvURL) != ""; {
			case env && !natsFlag:
				by, fix = "$NATS_URL", "unset NATS_URL"
			case env:
				fix = "leave --nats out and unset NATS_URL"
			}
			return fmt.Errorf("up: %s set the embedded server, but %s names another one (%s): %s to start the embedded server, or leave %s out to use that one",
				strings.Join(unused, ", "), by, bus.Redact(conn.Servers()), fix, strings.Join(unused, ", "))
		}
	} else {
		if conn, err = embeddedConn(conn, *serverCert, *serverKey, *serverCA); err != nil {
			return err
		}
		srv, err := embedded.Start(embedded.Options{Dir: *dataDir, Host: *host, Port: *port, MonitorPort: *monitorPort, Sync: syncPolicy,
			TLSCert: *serverCert, TLSKey: *serverKey, TLSClientCA: *serverCA})
		if err != nil {
			return err
		}
		defer srv.Stop()
		conn.URL = srv.ClientURL()
		if *serverCert == "" {
			// planact's own connections pass messages to the server in
			// process, without a socket (docs/deployment.md, "One
			// process"). Over TLS they go through the listener, so that
			// its certificates are what is used and checked.
			conn.InProcess = srv.Server
		}
		monitorURL = srv.MonitorURL()
		if so.Provisioning.Storage == 0 {
			// A small disk offers less than the default: take what it has.
			so.Provisioning.Storage = min(bus.DefaultStorage, srv.Storage()/10*9)
		}
	}
	url := bus.Redact(conn.Servers())
	say := func(format string, a ...any) {
		if !*asJSON {
			fmt.Fprintf(stdout, format, a...)
		}
	}
	say("planact: NATS at %s (try: nats --server %s sub 'rollout.*.status')\n", url, url)
	if monitorURL != "" {
		say("planact: NATS monitoring at %s (try: curl %s/varz)\n", monitorURL, monitorURL)
	}

	planner := schema.Engine{URL: *plannerURL, Protocol: *protocol}
	actor := schema.Engine{URL: *actorURL, Protocol: *protocol}
	for _, e := range []struct {
		eng  *schema.Engine
		role string
		seed int64
	}{{&planner, schema.RolePlanner, *seed}, {&actor, schema.RoleActor, *seed + 1}} {
		if e.eng.URL != "" {
			continue
		}
		u, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{
			Role: e.role, Seed: e.seed, TTFT: *ttft, PerToken: *latency, WeightVersion: e.role + "-v1",
			ActorErrorRate: *actorErr, PlannerStepwise: *stepwise,
		})
		if err != nil {
			return fmt.Errorf("simulated %s engine: %w", e.role, err)
		}
		*e.eng = schema.Engine{URL: u, Protocol: "sglang"}
		say("planact: simulated %s engine at %s\n", e.role, u)
	}

	if _, err := telemetry.ServeProfiles(ctx, *pprofAddr); err != nil {
		return fmt.Errorf("pprof: %w", err)
	}
	if murl, err := telemetry.ServeMetrics(ctx, *metricsAddr); err != nil {
		log.Warn().Err(err).Msg("metrics not served")
	} else if murl != "" {
		say("planact: metrics at %s\n", murl)
	}
	served := make(chan error, 1)
	go func() {
		if len(names) == 0 {
			<-ctx.Done()
			served <- nil
			return
		}
		so.Conn, so.Log = conn, log
		served <- stack.Serve(ctx, names, so)
	}()
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	ready := make(chan error, 1)
	go func() { ready <- stack.WaitReady(rctx, conn, names) }()
	select {
	case err = <-ready:
	case serr := <-served:
		// A service could not start (the web view's address in use, say):
		// its error says why, without waiting for the others.
		rcancel()
		<-ready
		if serr == nil {
			serr = errors.New("up: the services stopped while starting")
		}
		return serr
	}
	rcancel()
	if err != nil {
		cancel()
		if serr := <-served; serr != nil {
			return serr
		}
		return err
	}
	say("planact: services running: %s\n", strings.Join(names, ", "))
	if *webAddr != "" {
		say("planact: web view at http://%s/\n", *webAddr)
	}

	if !*runDemo {
		say("planact: ready. Trainers arrive on rollout.<N>.arrive.<role>; Ctrl-C stops.\n")
		select {
		case err := <-served:
			return err
		case <-ctx.Done():
			return <-served
		}
	}

	say("planact: demo — %d rollouts of %d tasks × %d samples; planner and actor trainers arrive on their own connections\n", *rollouts, *tasks, *group)
	var progress io.Writer = stdout
	if *asJSON {
		progress = nil
	}
	sum, err := demo.Run(ctx, demo.Options{
		Conn: conn, PlannerEngine: planner, ActorEngine: actor, Rollouts: *rollouts, Tasks: *tasks,
		SamplesPerPrompt: *group, Seed: *seed, Config: cfg, Progress: progress, FirstRollout: firstRollout(*dataDir, external),
	})
	interrupted := ctx.Err() != nil
	cancel()
	if serr := <-served; serr != nil && err == nil {
		err = serr
	}
	if interrupted {
		return errInterrupted
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(sum)
	}
	printSummary(stdout, sum)
	if sum.RolloutsFailed > 0 {
		return errors.New("some rollouts failed")
	}
	return nil
}

// firstRollout numbers the demo's rollouts from 1 on a fresh embedded
// server; on a kept data directory or a shared server, rollout ids already
// used would be answered from history, so the clock picks fresh ones.
func firstRollout(dataDir string, external bool) int64 {
	if dataDir == "" && !external {
		return 1
	}
	return time.Now().Unix()
}

// embeddedConn checks the flags of the embedded server's listener and
// says how planact's own clients reach it: with its certificate (or
// --tls-ca) as their root and, where it verifies clients, the client
// certificate. Credentials are for an external server; the embedded one
// has no users.
func embeddedConn(c bus.ConnOptions, cert, key, clientCA string) (bus.ConnOptions, error) {
	for _, v := range []struct {
		set  bool
		name string
	}{
		{c.Creds != "", "--creds ($NATS_CREDS)"}, {c.NKey != "", "--nkey ($NATS_NKEY)"},
		{c.User != "", "$NATS_USER"}, {c.Token != "", "$NATS_TOKEN"},
	} {
		if v.set {
			return c, fmt.Errorf("up: %s is for an external server (--nats or $NATS_URL); the embedded server has no users", v.name)
		}
	}
	switch {
	case (cert == "") != (key == ""):
		return c, errors.New("up: --tls-server-cert and --tls-server-key go together")
	case clientCA != "" && cert == "":
		return c, errors.New("up: --tls-server-ca needs --tls-server-cert and --tls-server-key")
	case clientCA != "" && c.Cert == "":
		return c, errors.New("up: with --tls-server-ca the embedded server verifies clients: give --tls-cert and --tls-key for planact's own connections")
	}
	if cert != "" && c.CA == "" {
		c.CA = cert // a self-signed certificate is its own root
	}
	return c, nil
}

func printSummary(w io.Writer, s *demo.Summary) {
	if ex := s.Example; ex != nil {
		fmt.Fprintf(w, "\none episode, as the planner saw it (rollout %d, episode %s, reward %.2f, label %q)\n", ex.Rollout, ex.Episode, ex.Reward, ex.Label)
		fmt.Fprintf(w, "  question: %s\n", ex.Question)
		for _, line := range strings.Split(strings.TrimSpace(ex.Transcript), "\n") {
			fmt.Fprintf(w, "  | %s\n", line)
		}
	}
	fmt.Fprintf(w, "\nsummary\n")
	fmt.Fprintf(w, "  rollouts completed  %d (failed %d) in %.1fs\n", s.RolloutsCompleted, s.RolloutsFailed, s.WallSeconds)
	fmt.Fprintf(w, "  episodes            %d  (%s)\n", s.Episodes, counts(s.EpisodeStatus))
	fmt.Fprintf(w, "  accuracy            %.1f%% (%d exact), mean reward %.3f, %.2f turns per episode\n", 100*s.Accuracy, s.Correct, s.MeanReward, s.MeanTurns)
	fmt.Fprintf(w, "  acts                %d\n", s.Acts)
	fmt.Fprintf(w, "  planner samples     %d (%d tokens)\n", s.PlannerSamples, s.PlannerTokens)
	fmt.Fprintf(w, "  actor samples       %d (%d tokens)\n", s.ActorSamples, s.ActorTokens)
}

// checkDemoMode refuses a mode planact does not know, and an ensemble_k
// or ensemble_pick that mode would not take.
func checkDemoMode(name string, k int, pick string) error {
	if !slices.Contains(schema.Modes, name) {
		return fmt.Errorf("up: --mode %q: want one of %s", name, strings.Join(schema.Modes, ", "))
	}
	cfg := schema.Config{Mode: name, EnsembleK: k, EnsemblePick: pick}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("up: --mode %s --ensemble-k %d --ensemble-pick %q: %w", name, k, pick, err)
	}
	return nil
}

// checkDemoFlags refuses, before anything starts, flags that could only
// fail later (or play something else than asked).
func checkDemoFlags(rollouts, tasks, group int, format, protocol string, rates ...float64) error {
	switch {
	case rollouts < 1:
		return fmt.Errorf("up: --rollouts %d: want at least 1", rollouts)
	case tasks < 1:
		return fmt.Errorf("up: --tasks %d: want at least 1", tasks)
	case group < 1:
		return fmt.Errorf("up: --samples-per-prompt %d: want at least 1", group)
	case !slices.Contains(schema.PlanFormats, format):
		return fmt.Errorf("up: --plan-format %q: want one of %s", format, strings.Join(schema.PlanFormats, ", "))
	case !slices.Contains(engine.Protocols, protocol):
		return fmt.Errorf("up: --protocol %q: want one of %s", protocol, strings.Join(engine.Protocols, ", "))
	}
	for _, r := range rates {
		if math.IsNaN(r) || r < 0 || r > 1 {
			return fmt.Errorf("up: --sim-actor-error-rate and --sim-stepwise are probabilities; %v is not one", r)
		}
	}
	return nil
}

// checkUpFlags refuses listener ports that no listener can have (the
// embedded server would fail after waiting for itself, naming the client
// port), and simulated times below zero, which were taken for none.
func checkUpFlags(port, monitorPort int, ttft, perToken time.Duration, metrics string) error {
	if metrics != "" {
		// A mistake in the address is refused (serve refuses it too); a
		// port another process holds is told at start and skipped.
		// A port that is no number (":abc") was only warned of, once
		// everything had started.
		if _, p, err := net.SplitHostPort(metrics); err != nil || !validPort(p) {
			return fmt.Errorf("up: --metrics %q: want host:port, or \"\" for none", metrics)
		}
	}
	// --port 0 is no "off": the embedded server took it for 4222.
	if port == 0 || port < -1 || port > 65535 {
		return fmt.Errorf("up: --port %d: want a port from 1 to 65535, or -1 for any free one", port)
	}
	if monitorPort < -1 || monitorPort > 65535 {
		return fmt.Errorf("up: --monitor-port %d: want a port from 1 to 65535, 0 for none or -1 for any free one", monitorPort)
	}
	return checkSimTimes("up: --sim-ttft", ttft, "up: --sim-per-token", perToken)
}

// validPort says whether p is a TCP port number, 0 (any free one) to 65535.
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 0 && n <= 65535
}

// checkEngineURL refuses an engine URL the gateways could not send to,
// naming its flag: an absolute http or https URL with a host, as the
// session-store wants at arrival. Without it, the arrival went out and
// was refused there (with submit, the other role's waited for its
// partner until the barrier's time-out).
func checkEngineURL(flag, raw string) error {
	u, err := url.Parse(raw)
	switch {
	case (err != nil || u.Scheme != "http" && u.Scheme != "https") && !strings.Contains(raw, "://"):
		return fmt.Errorf("%s %q: want an http or https URL: %q, say", flag, raw, "http://"+raw)
	case err != nil:
		return fmt.Errorf("%s %q: %w", flag, raw, errors.Unwrap(err))
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%s %q: scheme %q: want http or https", flag, raw, u.Scheme)
	case u.Host == "":
		return fmt.Errorf("%s %q: the URL names no host", flag, raw)
	}
	return nil
}

// checkSimTimes refuses a simulated time below zero, naming its flag.
func checkSimTimes(ttftFlag string, ttft time.Duration, perTokenFlag string, perToken time.Duration) error {
	switch {
	case ttft < 0:
		return fmt.Errorf("%s %v: want 0 or more", ttftFlag, ttft)
	case perToken < 0:
		return fmt.Errorf("%s %v: want 0 or more", perTokenFlag, perToken)
	}
	return nil
}

// counts prints a map of counts as "completed 22, failed 2", in key order.
func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
