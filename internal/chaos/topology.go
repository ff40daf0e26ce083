package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/freeport"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// Topology kinds.
const (
	Cluster = "cluster" // three nats-server processes, streams with three replicas
	Single  = "single"  // one nats-server on a data directory, one replica
)

// Service names, as `planact serve` knows them.
const (
	SessionStore   = "session-store"
	PlannerGateway = "planner-gateway"
	PlanParser     = "plan-parser"
	ActDispatcher  = "act-dispatcher"
	ActorGateway   = "actor-gateway"
)

// ServiceNames lists the services in the order they start, once `planact
// provision` has made the streams, buckets and consumers.
var ServiceNames = []string{SessionStore, PlannerGateway, PlanParser, ActDispatcher, ActorGateway}

// DefaultProcesses is how many processes of each service a topology runs.
func DefaultProcesses() map[string]int {
	return map[string]int{SessionStore: 1, PlannerGateway: 1, PlanParser: 1, ActDispatcher: 2, ActorGateway: 2}
}

// Retention is what `planact serve` is told to keep; zero fields are not
// passed (the services' defaults apply).
type Retention struct {
	History time.Duration // --history: streams' max age and sessions' lifetime
	Results time.Duration // --result-retention: how long result objects are kept
}

// TopologyOptions say what to run and where.
type TopologyOptions struct {
	Kind string // Cluster or Single
	Dir  string // work directory: configs, stores, logs
	Root string // the repository (compose/nats is read from it)
	Bin  Binaries
	// Auth keeps the users and permissions of compose/nats/accounts.conf:
	// every service connects as its own user, the trainers as trainer and
	// the harness as admin. Off by default.
	Auth      bool
	Retention Retention
	Processes map[string]int // per service; nil = DefaultProcesses
	SimFlags  []string       // extra flags of `planact sim`
	LogLevel  string         // PLANACT_LOG_LEVEL of the services; "" = theirs (info)
	// ServeFlags are more flags of `planact serve`, given to every service.
	ServeFlags []string
	Progress   io.Writer // one line per lifecycle event; nil = quiet
}

// Node is one nats-server.
type Node struct {
	Spec NodeSpec
	Proc *Proc
}

// Topology is the running system: NATS, services, simulated engines.
type Topology struct {
	Opts       TopologyOptions
	Nodes      []*Node
	Services   []*Proc
	Sim        *Proc
	PlannerURL string
	ActorURL   string
	// EngineSeeds are the simulated engines' seeds per role (`planact
	// sim --seed`, the actor's one more), against which samples are held.
	EngineSeeds map[string]int64

	knownUsers map[string]string // from accounts.conf, when Auth is on

	mu      sync.Mutex
	closing bool
	exits   []Exit
}

// Readiness markers in the processes' logs.
const (
	natsReady    = "Server is ready"
	serviceReady = "service started"
	simReady     = "simulated engines ready"
)

// patience bounds how long a process may take to become ready.
const patience = 2 * time.Minute

// StartTopology starts the NATS node(s), the simulated engines and the
// services, and waits until all are ready. On error, what it started is
// stopped.
func StartTopology(ctx context.Context, o TopologyOptions) (_ *Topology, err error) {
	if o.Kind != Cluster && o.Kind != Single {
		return nil, fmt.Errorf("topology %q: want %s or %s", o.Kind, Cluster, Single)
	}
	if o.Processes == nil {
		o.Processes = DefaultProcesses()
	}
	t := &Topology{Opts: o}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := t.startNATS(ctx); err != nil {
		return nil, err
	}
	if err := t.startSim(ctx); err != nil {
		return nil, err
	}
	if err := t.provision(ctx); err != nil {
		return nil, err
	}
	if err := t.startServices(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *Topology) progress(format string, a ...any) {
	if t.Opts.Progress != nil {
		fmt.Fprintf(t.Opts.Progress, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, a...)...)
	}
}

func (t *Topology) startNATS(ctx context.Context) error {
	n := 1
	if t.Opts.Kind == Cluster {
		n = 3
	}
	ports, err := freePorts(3 * n)
	if err != nil {
		return err
	}
	var routes []int
	if t.Opts.Kind == Cluster {
		routes = ports[n : 2*n]
	}
	env, err := t.passwordEnv()
	if err != nil {
		return err
	}
	for i := range n {
		name := fmt.Sprintf("nats-%d", i+1)
		spec := NodeSpec{Name: name, ClientPort: ports[i], HTTPPort: ports[2*n+i], StoreDir: filepath.Join(t.Opts.Dir, name, "jetstream")}
		if routes != nil {
			spec.ClusterPort = routes[i]
		}
		src, err := os.ReadFile(filepath.Join(t.Opts.Root, "compose", "nats", name+".conf"))
		if err != nil {
			return err
		}
		conf, err := NodeConfig(string(src), spec, routes, t.Opts.Auth)
		if err != nil {
			return fmt.Errorf("%s.conf: %w", name, err)
		}
		dir := filepath.Join(t.Opts.Dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if t.Opts.Auth {
			acc, err := os.ReadFile(filepath.Join(t.Opts.Root, "compose", "nats", "accounts.conf"))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), acc, 0o644); err != nil {
				return err
			}
		}
		path := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return err
		}
		node := &Node{Spec: spec, Proc: &Proc{
			Name: name, Kind: "nats", Path: t.Opts.Bin.NATSServer, Args: []string{"-c", path},
			Env: env, Log: filepath.Join(t.Opts.Dir, name+".log"),
		}}
		node.Proc.OnExit = t.supervise
		t.Nodes = append(t.Nodes, node)
	}
	for _, nd := range t.Nodes {
		if err := nd.Proc.Start(); err != nil {
			return err
		}
	}
	if err := t.WaitNodes(ctx, t.Nodes...); err != nil {
		return err
	}
	t.progress("nats: %s up (%s)", t.Opts.Kind, t.ClientURLs(""))
	return nil
}

// WaitNodes waits until every node logs that it is ready and its /healthz
// says JetStream is current.
func (t *Topology) WaitNodes(ctx context.Context, nodes ...*Node) error {
	ctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	for _, nd := range nodes {
		if err := nd.Proc.WaitLog(ctx, natsReady); err != nil {
			return err
		}
	}
	for _, nd := range nodes {
		if err := t.waitHealthy(ctx, nd); err != nil {
			return err
		}
	}
	return nil
}

func (t *Topology) waitHealthy(ctx context.Context, nd *Node) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", nd.Spec.HTTPPort)
	var last string
	for {
		resp, err := httpGet(ctx, url)
		if err == nil && resp.code == http.StatusOK {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %s", resp.code, strings.TrimSpace(string(resp.body)))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy (%s): %w", nd.Spec.Name, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (t *Topology) startSim(ctx context.Context) error {
	seed, err := simSeed(t.Opts.SimFlags)
	if err != nil {
		return err
	}
	t.EngineSeeds = map[string]int64{schema.RolePlanner: seed, schema.RoleActor: seed + 1}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	args := append([]string{"sim",
		"--planner-addr", fmt.Sprintf("127.0.0.1:%d", ports[0]),
		"--actor-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--ttft", "5ms", "--per-token", "200us",
	}, t.Opts.SimFlags...)
	t.Sim = &Proc{Name: "sim", Kind: "sim", Path: t.Opts.Bin.Planact, Args: args, Log: filepath.Join(t.Opts.Dir, "sim.log")}
	t.Sim.OnExit = t.supervise
	if err := t.Sim.Start(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	if err := t.Sim.WaitLog(wctx, simReady); err != nil {
		return err
	}
	t.PlannerURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	t.ActorURL = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	return nil
}

// simSeed reads the planner engine's seed from `planact sim` flags, as
// its flag set does (the last --seed wins; 1 without one).
func simSeed(flags []string) (int64, error) {
	seed := int64(1)
	for i := 0; i < len(flags); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(flags[i], "-"), "=")
		if !strings.HasPrefix(flags[i], "-") || name != "seed" {
			continue
		}
		if !hasValue {
			if i+1 == len(flags) {
				return 0, fmt.Errorf("sim flags %q: --seed without a value", flags)
			}
			i++
			value = flags[i]
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("sim flags: --seed %q: want an integer", value)
		}
		seed = n
	}
	return seed, nil
}

// ProvisionArgs are the arguments of `planact provision`, run once as the
// admin before the services start.
func (t *Topology) ProvisionArgs() []string {
	replicas := 1
	if t.Opts.Kind == Cluster {
		replicas = 3
	}
	args := []string{"provision", "--replicas", fmt.Sprint(replicas)}
	if r := t.Opts.Retention; r.History > 0 {
		args = append(args, "--history", r.History.String())
	}
	if r := t.Opts.Retention; r.Results > 0 {
		args = append(args, "--result-retention", r.Results.String())
	}
	return args
}

// provision runs `planact provision` as the admin, as a deployment does
// before its services start: they create nothing themselves.
func (t *Topology) provision(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	log := filepath.Join(t.Opts.Dir, "provision.log")
	cmd := exec.CommandContext(ctx, t.Opts.Bin.Planact, t.ProvisionArgs()...)
	cmd.Env = append(os.Environ(), "NATS_URL="+t.ClientURLs(""))
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(log, out, 0o644)
	if err != nil {
		return fmt.Errorf("planact %s: %w\n%s", strings.Join(t.ProvisionArgs(), " "), err, out)
	}
	t.progress("provisioned: %s", strings.Join(t.ProvisionArgs(), " "))
	return nil
}

// ServeArgs are the arguments of `planact serve` for one service.
func (t *Topology) ServeArgs(service string) []string {
	replicas := 1
	if t.Opts.Kind == Cluster {
		replicas = 3
	}
	args := []string{"serve", "--replicas", fmt.Sprint(replicas)}
	if r := t.Opts.Retention; r.History > 0 {
		args = append(args, "--history", r.History.String())
	}
	if r := t.Opts.Retention; r.Results > 0 {
		args = append(args, "--result-retention", r.Results.String())
	}
	args = append(args, t.Opts.ServeFlags...)
	return append(args, service)
}

func (t *Topology) startServices(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	for i, name := range ServiceNames {
		for r := range max(t.Opts.Processes[name], 1) {
			p := &Proc{
				Name: fmt.Sprintf("%s-%d", name, r+1), Kind: name, Path: t.Opts.Bin.Planact,
				Args: t.ServeArgs(name), Env: []string{"NATS_URL=" + t.ClientURLs(name)},
				Log: filepath.Join(t.Opts.Dir, fmt.Sprintf("%s-%d.log", name, r+1)),
			}
			if t.Opts.LogLevel != "" {
				p.Env = append(p.Env, "PLANACT_LOG_LEVEL="+t.Opts.LogLevel)
			}
			p.OnExit = t.supervise
			if err := p.Start(); err != nil {
				return err
			}
			t.Services = append(t.Services, p)
		}
		// The session-store first (it sweeps what was there), then the
		// others together.
		if i == 0 || i == len(ServiceNames)-1 {
			for _, p := range t.Services {
				if err := p.WaitLog(ctx, serviceReady); err != nil {
					return err
				}
			}
		}
	}
	t.progress("services: %d processes up", len(t.Services))
	return nil
}

// WaitService waits until a (re)started service process is ready.
func (t *Topology) WaitService(ctx context.Context, p *Proc) error {
	ctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	return p.WaitLog(ctx, serviceReady)
}

// supervise restarts a process that exited on its own, as a container
// runtime with a restart policy would, and records the exit.
func (t *Topology) supervise(p *Proc, e Exit) {
	t.mu.Lock()
	closing := t.closing
	if !closing {
		t.exits = append(t.exits, e)
	}
	t.mu.Unlock()
	if closing {
		return
	}
	t.progress("UNEXPECTED EXIT of %s (%s); restarting it in 1s", p.Name, e.Err)
	time.Sleep(time.Second)
	t.mu.Lock()
	closing = t.closing
	t.mu.Unlock()
	if !closing && !p.Running() {
		if err := p.Start(); err != nil {
			t.progress("restart of %s failed: %v", p.Name, err)
		}
	}
}

// Exits returns the exits of processes that the harness did not cause.
func (t *Topology) Exits() []Exit {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Exit(nil), t.exits...)
}

// Violations returns the permission violations the nodes logged (with
// Auth on, a service that needs a subject its user may not use).
func (t *Topology) Violations() []string {
	var out []string
	for _, n := range t.Nodes {
		data, err := os.ReadFile(n.Proc.Log)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "Violation") {
				out = append(out, n.Spec.Name+": "+line)
			}
		}
	}
	return out
}

// Procs returns every process of the topology.
func (t *Topology) Procs() []*Proc {
	var ps []*Proc
	for _, n := range t.Nodes {
		ps = append(ps, n.Proc)
	}
	ps = append(ps, t.Services...)
	if t.Sim != nil {
		ps = append(ps, t.Sim)
	}
	return ps
}

// ServiceProcs returns the processes of one service.
func (t *Topology) ServiceProcs(service string) []*Proc {
	var ps []*Proc
	for _, p := range t.Services {
		if p.Kind == service {
			ps = append(ps, p)
		}
	}
	return ps
}

// Close kills every process (SIGKILL to each process group) for good. It
// is safe to call more than once.
func (t *Topology) Close() {
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range t.Procs() {
		wg.Add(1)
		go func() { defer wg.Done(); p.Retire() }()
	}
	wg.Wait()
}

// Users are the NATS users of compose/nats/accounts.conf with the
// environment variable that holds each one's password; read from the file
// so that users added there need nothing here.
func (t *Topology) users() (map[string]string, error) {
	data, err := os.ReadFile(filepath.Join(t.Opts.Root, "compose", "nats", "accounts.conf"))
	if err != nil {
		return nil, err
	}
	users := map[string]string{}
	for _, m := range userLine.FindAllStringSubmatch(string(data), -1) {
		users[m[1]] = m[2]
	}
	if len(users) == 0 {
		return nil, errors.New("accounts.conf: no users with a $PLANACT_PW_… password")
	}
	return users, nil
}

var userLine = regexp.MustCompile(`user:\s*([A-Za-z0-9_-]+)\s*,?\s*password:\s*\$([A-Za-z0-9_]+)`)

func password(user string) string { return "chaos-" + user }

// passwordEnv sets every user's password for nats-server, when Auth is on.
func (t *Topology) passwordEnv() ([]string, error) {
	if !t.Opts.Auth {
		return nil, nil
	}
	users, err := t.users()
	if err != nil {
		return nil, err
	}
	t.knownUsers = users
	var env []string
	for u, v := range users {
		env = append(env, v+"="+password(u))
	}
	return env, nil
}

// TrainerUser is the NATS user a trainer of role connects as: its own
// (trainer-<role>) where accounts.conf has one, else trainer.
func (t *Topology) TrainerUser(role string) string {
	if _, ok := t.knownUsers["trainer-"+role]; ok {
		return "trainer-" + role
	}
	return "trainer"
}

// ClientURLs returns the comma-separated client URLs of every node, with
// user's credentials when Auth is on ("" for the admin user).
func (t *Topology) ClientURLs(user string) string {
	var urls []string
	for _, n := range t.Nodes {
		u := fmt.Sprintf("nats://127.0.0.1:%d", n.Spec.ClientPort)
		if t.Opts.Auth {
			if user == "" {
				user = "admin"
			}
			u = fmt.Sprintf("nats://%s:%s@127.0.0.1:%d", user, password(user), n.Spec.ClientPort)
		}
		urls = append(urls, u)
	}
	return strings.Join(urls, ",")
}

// Connect opens a connection to the topology that rides out node restarts,
// as user ("" for the admin), under the user's own inbox prefix.
func (t *Topology) Connect(user, name string) (*nats.Conn, error) {
	inbox := bus.InboxPrefix(cmp.Or(user, "admin"))
	return nats.Connect(t.ClientURLs(user),
		nats.CustomInboxPrefix(inbox),
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectBufSize(64<<20),
	)
}

// NodeByName returns the node with server_name name.
func (t *Topology) NodeByName(name string) *Node {
	for _, n := range t.Nodes {
		if n.Spec.Name == name {
			return n
		}
	}
	return nil
}

// MetaLeader returns the node that leads the JetStream meta group, asking
// the monitoring endpoint (/jsz) of the running nodes.
func (t *Topology) MetaLeader(ctx context.Context) (*Node, error) {
	var last error
	for _, n := range t.Nodes {
		if !n.Proc.Running() {
			continue
		}
		resp, err := httpGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/jsz", n.Spec.HTTPPort))
		if err != nil {
			last = err
			continue
		}
		var jsz struct {
			Meta *struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		if err := json.Unmarshal(resp.body, &jsz); err != nil {
			last = err
			continue
		}
		if jsz.Meta != nil && jsz.Meta.Leader != "" {
			if l := t.NodeByName(jsz.Meta.Leader); l != nil {
				return l, nil
			}
			last = fmt.Errorf("meta leader %q is no node of this topology", jsz.Meta.Leader)
		}
	}
	if last == nil {
		last = errors.New("no node knows a meta leader")
	}
	return nil, last
}

// StreamLeader returns the node that leads stream, from the JetStream API
// ($JS.API.STREAM.INFO.<stream>, cluster.leader).
func (t *Topology) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (*Node, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	c := st.CachedInfo().Cluster
	if c == nil || c.Leader == "" {
		return nil, fmt.Errorf("stream %s has no leader", stream)
	}
	n := t.NodeByName(c.Leader)
	if n == nil {
		return nil, fmt.Errorf("stream %s leader %q is no node of this topology", stream, c.Leader)
	}
	return n, nil
}

type httpResp struct {
	code int
	body []byte
}

func httpGet(ctx context.Context, url string) (httpResp, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return httpResp{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return httpResp{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return httpResp{code: resp.StatusCode, body: body}, err
}

// freePorts returns n distinct loopback ports, free when picked, that no
// outgoing connection takes meanwhile (internal/freeport): a node is
// started on them, and restarted on them after each kill.
func freePorts(n int) ([]int, error) { return freeport.Ports(n) }
