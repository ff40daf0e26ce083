package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/bench/internal/rawjs"
	"github.com/planact/planact/internal/chaos"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// progress prints what the harness is doing, with the time since it began.
type progress struct {
	w     io.Writer
	begin time.Time
}

func (p *progress) say(format string, a ...any) {
	fmt.Fprintf(p.w, "[%6.1fs] %s\n", time.Since(p.begin).Seconds(), fmt.Sprintf(format, a...))
}

// snapshot is every counter the run's figures are deltas of.
type snapshot struct {
	At      time.Time
	Procs   map[string]procStat
	Wakes   map[string]procWakes // of the processes running then
	Varz    varz
	Streams map[string]jetstream.StreamState
}

func takeSnapshot(ctx context.Context, c *cluster, monitor string, js jetstream.JetStream) (snapshot, error) {
	s := snapshot{At: time.Now(), Procs: c.sample().Stats, Wakes: map[string]procWakes{}, Streams: map[string]jetstream.StreamState{}}
	for _, p := range c.all() {
		if pid := p.PID(); pid != 0 {
			if w, err := readWakes(pid); err == nil {
				s.Wakes[p.Name] = w
			}
		}
	}
	var err error
	if s.Varz, err = getVarz(ctx, monitor); err != nil {
		return s, err
	}
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		s.Streams[info.Config.Name] = info.State
	}
	return s, lister.Err()
}

func runHarness(ctx context.Context, o options, stdout io.Writer) error {
	p := &progress{w: stdout, begin: time.Now()}
	rep := &Report{Options: o, Machine: machine()}
	root, err := chaos.RepoRoot(".")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "planact-step-*")
	if err != nil {
		return err
	}
	if o.Keep {
		p.say("work directory (kept): %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	p.say("building planact and nats-server")
	bins, err := chaos.Build(ctx, root, dir)
	if err != nil {
		return err
	}
	c := &cluster{dir: dir}
	defer c.stop()

	var prof *profiler
	if o.Profile != "" {
		if err := os.MkdirAll(o.Profile, 0o755); err != nil {
			return err
		}
		prof = newProfiler(o.Profile)
	}
	// The engines' ports, chosen first: `planact up` is told them, and so
	// starts no simulated engines of its own.
	eports, err := freePorts(2)
	if err != nil {
		return err
	}
	var natsURL, monitor string
	if o.OneProcess {
		natsURL, monitor, err = startOneProcess(ctx, c, o, bins, prof, rep, p, eports)
	} else {
		natsURL, monitor, err = startProcesses(ctx, c, o, root, bins, prof, rep, p)
	}
	if err != nil {
		return err
	}

	// The engines.
	espec := engineSpec{Model: o.Model, PlannerAddr: fmt.Sprintf("127.0.0.1:%d", eports[0]), ActorAddr: fmt.Sprintf("127.0.0.1:%d", eports[1]),
		PlannerWeight: rolePlanner + "-step-0", ActorWeight: roleActor + "-step-0"}
	especPath, err := writeSpec(dir, "engines.json", espec)
	if err != nil {
		return err
	}
	if _, err := c.start(ctx, "engines", groupEngines, self, []string{"-role", "engines", "-spec", especPath}, engineReady); err != nil {
		return err
	}
	plannerURL, actorURL := "http://"+espec.PlannerAddr, "http://"+espec.ActorAddr
	p.say("engines up: planner %s (serves %d at once), actor %s (serves %d)", plannerURL, o.Model.Planner.Limit, actorURL, o.Model.Actor.Limit)

	_, js, err := rawjs.Dial(natsURL, "bench-step-harness")
	if err != nil {
		return err
	}
	before, err := takeSnapshot(ctx, c, monitor, js)
	if err != nil {
		return err
	}
	var tl *tally
	if o.Tally {
		if tl, err = startTally(natsURL); err != nil {
			return fmt.Errorf("-tally: %w", err)
		}
	}
	smp := c.sampleEvery(500 * time.Millisecond)
	if prof != nil {
		prof.start(ctx)
		p.say("profiling %d processes (CPU, %v windows) into %s", len(prof.targets), profileWindow, o.Profile)
	}

	// The trainers.
	cfg := stepConfig(o)
	first := int64(1)
	var logPaths []string
	var trainers []*proc
	for _, role := range []string{rolePlanner, roleActor} {
		url, capacity := plannerURL, o.Model.Planner.Limit
		if role == roleActor {
			url, capacity = actorURL, o.Model.Actor.Limit
		}
		if !o.StateCapacity {
			capacity = 0
		}
		spec := trainerOptions{Role: role, NATS: natsURL, Engine: url, Capacity: capacity, First: first, Rollouts: o.Rollouts, Prompts: o.Prompts,
			Target: o.TargetGroups, Swap: o.Swap, Abort: o.PauseAbort, Timeout: o.Timeout, Config: cfg, Model: o.Model}
		path, err := writeSpec(dir, "trainer-"+role+".json", spec)
		if err != nil {
			return err
		}
		out := filepath.Join(dir, "trainer-"+role+".out.json")
		logPaths = append(logPaths, out)
		t, err := c.start(ctx, "trainer-"+role, groupTrainer, self, []string{"-role", "trainer", "-spec", path, "-out", out}, "")
		if err != nil {
			return err
		}
		trainers = append(trainers, t)
	}
	p.say("trainers started: %d rollouts of %d prompts × %d copies = %d episodes each, target_groups %s, async, stream_groups",
		o.Rollouts, o.Prompts, o.Model.Copies, o.Prompts*o.Model.Copies, targetLine(o))
	if err := waitTrainers(ctx, c, trainers, o.Timeout+time.Minute, p); err != nil {
		return err
	}
	after, err := takeSnapshot(ctx, c, monitor, js)
	if err != nil {
		return err
	}
	samples := smp.end()
	var tallied, talliedBytes map[string]int64
	if tl != nil {
		if tallied, talliedBytes, err = tl.end(); err != nil {
			return fmt.Errorf("-tally: %w", err)
		}
	}
	if prof != nil {
		p.say("waiting for the last profile windows")
		prof.end(ctx)
	}
	p.say("trainers done; reading the engines' call logs and when planact stored each rollout's start, groups and results")
	stored := storedTimes(ctx, js, first, o.Rollouts)
	var calls [2]Calls
	for i, u := range []string{plannerURL, actorURL} {
		if err := getJSON(ctx, u+"/bench/calls", &calls[i]); err != nil {
			return err
		}
	}
	var logs []TrainerLog
	for _, path := range logPaths {
		var l TrainerLog
		data, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(data, &l)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if l.Err != "" {
			return fmt.Errorf("trainer %s: %s", l.Role, l.Err)
		}
		logs = append(logs, l)
	}
	c.stop()
	rep.Machine.LoadAfter = loadavg()
	p.say("analysing: the lower bound from %d episode scripts, a replay without planact", o.Rollouts*o.Prompts*o.Model.Copies)
	if err := rep.analyse(o, calls, logs, stored, before, after, samples, c); err != nil {
		return err
	}
	if tallied != nil {
		rep.Messages.Tally = tallyRows(tallied, talliedBytes, float64(rep.Run.Acts))
	}
	if prof != nil {
		if err := writeProfileSummaries(ctx, prof, o.Profile); err != nil {
			return err
		}
		p.say("profiles: %s", filepath.Join(o.Profile, "profiles.txt"))
	}
	rep.WallS = time.Since(p.begin).Seconds()
	return rep.write(o, stdout)
}

// startProcesses starts the deployment's topology on loopback: nats-server
// with compose's node configuration, provisioned as an admin does, and one
// `planact serve` process per replica of each service. It measures the raw
// JetStream baseline on the server before the services start.
func startProcesses(ctx context.Context, c *cluster, o options, root string, bins chaos.Binaries, prof *profiler, rep *Report, p *progress) (natsURL, monitor string, err error) {
	// NATS: compose's node configuration on loopback, one node.
	ports, err := freePorts(3) // client, monitor, profiles
	if err != nil {
		return "", "", err
	}
	src, err := os.ReadFile(filepath.Join(root, "compose", "nats", "nats-1.conf"))
	if err != nil {
		return "", "", err
	}
	conf, err := chaos.NodeConfig(string(src), chaos.NodeSpec{Name: "nats-1", ClientPort: ports[0], HTTPPort: ports[1],
		StoreDir: filepath.Join(c.dir, "nats-1", "jetstream")}, nil, false)
	if err != nil {
		return "", "", fmt.Errorf("compose/nats/nats-1.conf: %w", err)
	}
	if prof != nil {
		// nats-server serves its profiles on prof_port.
		conf += fmt.Sprintf("\nprof_port: %d\n", ports[2])
		prof.add("nats-server", fmt.Sprintf("http://127.0.0.1:%d", ports[2]))
	}
	confPath := filepath.Join(c.dir, "nats-1.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return "", "", err
	}
	natsURL = fmt.Sprintf("nats://127.0.0.1:%d", ports[0])
	monitor = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	natsProc, err := c.startEnv(ctx, "nats-server", groupNATS, bins.NATSServer, []string{"-c", confPath}, o.NATSEnv, "Server is ready")
	if err != nil {
		return "", "", err
	}
	p.say("nats-server up at %s (compose's nats-1.conf: sync_interval 1s)", natsURL)

	// The baseline, on the same server, before planact starts.
	if err := measureRaw(ctx, o, natsURL, monitor, natsProc, "server", rep, p); err != nil {
		return "", "", err
	}

	// Provisioning, as the admin of a deployment does once (`planact
	// provision`): the services create nothing themselves.
	prov := exec.CommandContext(ctx, bins.Planact, "provision", "--nats", natsURL)
	if out, err := prov.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("planact provision: %w\n%s", err, out)
	}
	// The services: the session-store first, then the rest.
	serve := func(svc string, i int) error {
		name := fmt.Sprintf("%s-%d", svc, i+1)
		args := append([]string{"serve", "--nats", natsURL}, o.ServeFlags...)
		if prof != nil {
			pp, err := freePorts(1)
			if err != nil {
				return err
			}
			addr := fmt.Sprintf("127.0.0.1:%d", pp[0])
			args = append(args, "--pprof", addr)
			prof.add(name, "http://"+addr)
		}
		args = append(args, svc)
		_, err := c.startEnv(ctx, name, groupPlanact, bins.Planact, args, o.ServeEnv, "service started")
		return err
	}
	for i := range o.Replicas[chaos.SessionStore] {
		if err := serve(chaos.SessionStore, i); err != nil {
			return "", "", err
		}
	}
	for _, svc := range chaos.ServiceNames[1:] {
		for i := range o.Replicas[svc] {
			if err := serve(svc, i); err != nil {
				return "", "", err
			}
		}
	}
	p.say("services up: %s", replicaLine(o.Replicas))

	return natsURL, monitor, nil
}

// startOneProcess starts the one-process topology: `planact up` with its
// embedded server (sync 1s, as compose's nodes) and every service in it,
// connected in process. The raw JetStream baseline runs on its server
// before the trainers come, while the services wait idle. It is given the
// engines' ports (eports: the planner's, the actor's) as its engine URLs,
// which it only names (no demo runs), so it starts no simulated engines
// that would sit idle in the process measured.
func startOneProcess(ctx context.Context, c *cluster, o options, bins chaos.Binaries, prof *profiler, rep *Report, p *progress, eports []int) (natsURL, monitor string, err error) {
	ports, err := freePorts(3) // client, monitor, profiles
	if err != nil {
		return "", "", err
	}
	natsURL = fmt.Sprintf("nats://127.0.0.1:%d", ports[0])
	monitor = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	args := append([]string{"up", "--port", fmt.Sprint(ports[0]), "--monitor-port", fmt.Sprint(ports[1]), "--sync", "1s",
		"--data", filepath.Join(c.dir, "up"), "--metrics", "", "--log-level", "info",
		"--planner-url", fmt.Sprintf("http://127.0.0.1:%d", eports[0]), "--actor-url", fmt.Sprintf("http://127.0.0.1:%d", eports[1])}, o.ServeFlags...)
	if prof != nil {
		addr := fmt.Sprintf("127.0.0.1:%d", ports[2])
		args = append(args, "--pprof", addr)
		prof.add("planact-up", "http://"+addr)
	}
	up, err := c.startEnv(ctx, "planact-up", groupPlanact, bins.Planact, args, o.ServeEnv, "services running")
	if err != nil {
		return "", "", err
	}
	p.say("planact up: its server at %s and the five services in one process", natsURL)
	if err := measureRaw(ctx, o, natsURL, monitor, up, "server and idle services", rep, p); err != nil {
		return "", "", err
	}
	return natsURL, monitor, nil
}

// measureRaw runs the raw JetStream baseline on the run's server (its
// process server, which holds what is named serverIs) into rep.Raw.
func measureRaw(ctx context.Context, o options, natsURL, monitor string, server *proc, serverIs string, rep *Report, p *progress) error {
	p.say("raw JetStream baseline: publish+consume, 3 × %d act-sized messages", o.RawMessages)
	var err error
	if rep.Raw, err = rawBaseline(ctx, o, natsURL, monitor, server, &o.Model); err != nil {
		return fmt.Errorf("raw baseline: %w", err)
	}
	p.say("raw: %.0f msgs/s; %.4f ms of CPU per message (%s %.4f, client %.4f); %.2f NATS messages per message",
		rep.Raw.MsgsPerS, rep.Raw.CPUPerMsgMs, serverIs, rep.Raw.ServerCPUPerMsgMs, rep.Raw.ClientCPUPerMsgMs, rep.Raw.NATSMsgsPerMsg)
	return nil
}

// Stored is when planact stored a rollout's milestones (the stream's
// timestamps; 0 where the message was not found).
type Stored struct {
	StartNs     int64    `json:"start_ns"`      // rollout.N.start: the barrier released
	LastGroupNs int64    `json:"last_group_ns"` // the last group delivered (planner's)
	ResultNs    [2]int64 `json:"result_ns"`     // each role's result (planner, actor)
	Missing     []string `json:"missing,omitempty"`
}

// storedTimes reads, from the streams, when each rollout's start, last
// group and results were stored.
func storedTimes(ctx context.Context, js jetstream.JetStream, first int64, rollouts int) []Stored {
	last := func(subj string) (int64, error) {
		name, err := js.StreamNameBySubject(ctx, subj)
		if err != nil {
			return 0, err
		}
		st, err := js.Stream(ctx, name)
		if err != nil {
			return 0, err
		}
		m, err := st.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			return 0, err
		}
		return m.Time.UnixNano(), nil
	}
	var out []Stored
	for i := range rollouts {
		n := first + int64(i)
		var s Stored
		for _, q := range []struct {
			subj string
			to   *int64
		}{
			{subject.Start(n), &s.StartNs},
			{subject.Groups(n, schema.RolePlanner), &s.LastGroupNs},
			{subject.Result(n, schema.RolePlanner), &s.ResultNs[0]},
			{subject.Result(n, schema.RoleActor), &s.ResultNs[1]},
		} {
			t, err := last(q.subj)
			if err != nil {
				s.Missing = append(s.Missing, fmt.Sprintf("%s: %v", q.subj, err))
				continue
			}
			*q.to = t
		}
		out = append(out, s)
	}
	return out
}

// stepConfig is the rollouts' configuration: defaults, but room for the
// model's turns, plans and lengths, seeded sampling, groups streamed, and
// the target groups.
func stepConfig(o options) schema.Config {
	cfg := schema.DefaultConfig()
	cfg.MaxTurns = o.Model.Turns.Max()
	cfg.MaxNodes = max(cfg.MaxNodes, o.Model.Width.Max())
	cfg.MaxContextTokens = 1 << 17
	cfg.PlannerSampling.MaxNewTokens = o.Model.Planner.MaxTokens + 64*o.Model.Width.Max() + 256
	cfg.ActorSampling.MaxNewTokens = o.Model.Actor.MaxTokens + 64
	seed := o.Model.Seed
	cfg.PlannerSampling.Seed, cfg.ActorSampling.Seed = &seed, &seed
	cfg.StreamGroups = true
	cfg.TargetGroups = o.TargetGroups
	cfg.ResultSamples = o.ResultSamples
	return cfg
}

func targetLine(o options) string {
	if o.TargetGroups == 0 {
		return "off (every group)"
	}
	return fmt.Sprintf("%d of %d", o.TargetGroups, o.Prompts)
}

func replicaLine(r map[string]int) string {
	var parts []string
	for _, name := range chaos.ServiceNames {
		parts = append(parts, fmt.Sprintf("%s ×%d", name, r[name]))
	}
	return strings.Join(parts, ", ")
}

func writeSpec(dir, name string, v any) (string, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, data, 0o644)
}

// waitTrainers waits until every trainer process exited, saying every half
// minute that it waits. Any other process that exits meanwhile fails the
// run: a service that crashes is a finding, not noise.
func waitTrainers(ctx context.Context, c *cluster, ts []*proc, limit time.Duration, p *progress) error {
	deadline := time.Now().Add(limit)
	next := time.Now().Add(30 * time.Second)
	for {
		for _, q := range c.all() {
			if ex := q.Exits(); q.Group != groupTrainer && len(ex) > 0 {
				return fmt.Errorf("%s exited during the step (%s); its log ends:\n%s", q.Name, ex[0].Err, ex[0].LogTail)
			}
		}
		running := 0
		for _, t := range ts {
			if t.Running() {
				running++
			}
		}
		if running == 0 {
			for _, t := range ts {
				if ex := t.Exits(); len(ex) > 0 && ex[0].Err != "<nil>" {
					return fmt.Errorf("%s: %s; its log ends:\n%s", t.Name, ex[0].Err, ex[0].LogTail)
				}
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the trainers did not finish in %v", limit)
		}
		if time.Now().After(next) {
			p.say("%d trainers still running", running)
			next = time.Now().Add(30 * time.Second)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// rawBaseline measures raw JetStream on the run's server: publish+consume
// of act-sized messages, with the server's and this process's CPU and the
// server's message counts per message.
func rawBaseline(ctx context.Context, o options, url, monitor string, srv *proc, m *Model) (Raw, error) {
	prompt := 200 + int(m.PromptTokens.Median/4)
	out := int(m.Actor.Tokens.Mean())
	data, err := rawjs.Act(prompt, out)
	if err != nil {
		return Raw{}, err
	}
	r := Raw{Messages: 3 * o.RawMessages, MessageBytes: len(data), PromptTokens: prompt, OutputTokens: out, InFlight: 256}
	v0, err := getVarz(ctx, monitor)
	if err != nil {
		return r, err
	}
	s0, err := readProc(srv.PID())
	if err != nil {
		return r, err
	}
	c0 := selfCPU()
	var rates []float64
	for i := range 3 {
		rate, err := rawjs.PublishConsume(ctx, rawjs.PubSub{PublishURL: url, ConsumeURL: url, Data: data, Messages: o.RawMessages,
			InFlight: r.InFlight, Replicas: 1, Round: fmt.Sprint(i)})
		if err != nil {
			return r, err
		}
		rates = append(rates, rate)
	}
	c1 := selfCPU()
	s1, err := readProc(srv.PID())
	if err != nil {
		return r, err
	}
	v1, err := getVarz(ctx, monitor)
	if err != nil {
		return r, err
	}
	n := float64(r.Messages)
	r.Repeats = rates
	r.MsgsPerS = median(rates)
	r.ServerCPUPerMsgMs = ms(s1.CPU-s0.CPU) / n
	r.ClientCPUPerMsgMs = ms(c1-c0) / n
	r.CPUPerMsgMs = r.ServerCPUPerMsgMs + r.ClientCPUPerMsgMs
	r.NATSMsgsPerMsg = float64(v1.InMsgs-v0.InMsgs+v1.OutMsgs-v0.OutMsgs) / n
	return r, nil
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Machine is where and when the run ran.
type Machine struct {
	CPUs       int    `json:"cpus"`
	Go         string `json:"go"`
	Date       string `json:"date"`
	LoadBefore string `json:"loadavg_before"`
	LoadAfter  string `json:"loadavg_after"`
}

func machine() Machine {
	return Machine{CPUs: runtime.NumCPU(), Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		Date: time.Now().UTC().Format(time.RFC3339), LoadBefore: loadavg()}
}

func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

var errNoActs = errors.New("no act ran: nothing to divide by")
