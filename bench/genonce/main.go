// Command genonce measures how many times planact pays an engine for one
// planner turn or one act when engines are slow or busy: every service on
// an embedded server, simulated engines behind a counter of their
// generation requests, default settings otherwise. Two scenarios, as users
// met them:
//
//   - slow: planner generations longer than the consumers' 5 s ack wait
//     (-slow, 6 s), more episodes than the planner-gateway's width;
//   - limited: 1 s engines (-limited-latency) and an engine limit of 8 per
//     gateway (-limit, `serve --engine-limit 8`), below the width.
//
// It prints, per scenario, the turns and acts the results hold, the
// generation requests the engines saw, duplicate engine calls per turn and
// per act (requests beyond one per turn or act), and turns per second. The
// counts come from the engines' side (requests per episode, against the
// turns and acts the results report), so the same program measures any
// planact version.
//
//	go run ./bench/genonce [-episodes 96] [-slow 6s] [-limited-latency 1s] [-limit 8]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

func main() {
	episodes := flag.Int("episodes", 96, "episodes per scenario (one rollout)")
	slow := flag.Duration("slow", 6*time.Second, "slow scenario: the planner's time to first token")
	latency := flag.Duration("limited-latency", time.Second, "limited scenario: both engines' time to first token")
	limit := flag.Int("limit", 8, "limited scenario: generations in flight per engine in each gateway (serve --engine-limit)")
	flag.Parse()
	if err := run(*episodes, *slow, *latency, *limit, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/genonce:", err)
		os.Exit(1)
	}
}

type scenario struct {
	name           string
	planner, actor sim.Config
	limit          int
}

func run(episodes int, slow, latency time.Duration, limit int, out io.Writer) error {
	scenarios := []scenario{
		{name: fmt.Sprintf("slow (planner %v, ack wait 5s)", slow), planner: sim.Config{TTFT: slow}, actor: sim.Config{TTFT: 50 * time.Millisecond}},
		{name: fmt.Sprintf("limited (engines %v, limit %d)", latency, limit), planner: sim.Config{TTFT: latency}, actor: sim.Config{TTFT: latency}, limit: limit},
	}
	fmt.Fprintf(out, "planact generation-once benchmark: %d episodes per scenario, default settings\n", episodes)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tturns\tplanner calls\tdup/turn\tacts\tactor calls\tdup/act\tepisodes with a turn twice\twall s\tturns/s\t")
	for i, sc := range scenarios {
		r, err := measure(sc, episodes, int64(i+1))
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.3f\t%d\t%d\t%.3f\t%d\t%.1f\t%.1f\t\n", sc.name, r.turns, r.plannerCalls, float64(r.plannerCalls-r.turns)/float64(r.turns),
			r.acts, r.actorCalls, float64(r.actorCalls-r.acts)/float64(max(r.acts, 1)), r.twice, r.wall.Seconds(), float64(r.turns)/r.wall.Seconds())
	}
	return tw.Flush()
}

type result struct {
	turns, acts, plannerCalls, actorCalls, twice int
	wall                                         time.Duration
}

// counter counts an engine's generation requests per episode (the routing
// key every planact version sends).
type counter struct {
	next http.Handler
	mu   sync.Mutex
	per  map[string]int
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/generate", "/v1/completions", "/v1/chat/completions":
		c.mu.Lock()
		c.per[r.Header.Get("X-SMG-Routing-Key")]++
		c.mu.Unlock()
	}
	c.next.ServeHTTP(w, r)
}

func (c *counter) total() (n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.per {
		n += k
	}
	return n
}

func serve(ctx context.Context, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); srv.Close() }()
	return "http://" + ln.Addr().String(), nil
}

func measure(sc scenario, episodes int, seed int64) (*result, error) {
	dir, err := os.MkdirTemp("", "planact-bench-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{Dir: dir, Port: -1})
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc.planner.Role, sc.planner.Seed, sc.planner.WeightVersion = schema.RolePlanner, seed, "planner-v1"
	sc.actor.Role, sc.actor.Seed, sc.actor.WeightVersion = schema.RoleActor, seed+100, "actor-v1"
	counters := map[string]*counter{}
	urls := map[string]string{}
	for _, cfg := range []sim.Config{sc.planner, sc.actor} {
		c := &counter{next: sim.New(cfg), per: map[string]int{}}
		u, err := serve(ctx, c)
		if err != nil {
			return nil, err
		}
		counters[cfg.Role], urls[cfg.Role] = c, u
	}
	conn := bus.ConnOptions{URL: srv.ClientURL()}
	served := make(chan error, 1)
	go func() {
		served <- stack.Serve(ctx, stack.Services, stack.Options{Provision: true, Conn: conn, Log: zerolog.Nop(), EngineLimit: sc.limit})
	}()
	if err := stack.WaitReady(ctx, conn, stack.Services); err != nil {
		return nil, err
	}
	nc, err := conn.Dial("bench-genonce")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return nil, err
	}
	tasks := demo.Tasks(sim.DefaultWorld(), episodes, 1, seed, "")
	begin := time.Now()
	res, err := rollout(ctx, c, seed, urls, tasks)
	if err != nil {
		return nil, err
	}
	r := &result{wall: time.Since(begin), acts: res.Stats.Acts, plannerCalls: counters[schema.RolePlanner].total(), actorCalls: counters[schema.RoleActor].total()}
	perEpisode := map[string]int{}
	for _, s := range res.Samples {
		turns := asInt(s.Metadata["turns"])
		r.turns += turns
		perEpisode[s.RolloutID] = turns
	}
	counters[schema.RolePlanner].mu.Lock()
	for ep, turns := range perEpisode {
		if counters[schema.RolePlanner].per[ep] > turns {
			r.twice++
		}
	}
	counters[schema.RolePlanner].mu.Unlock()
	cancel()
	if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	return r, nil
}

// rollout has both roles arrive and returns the planner's result.
func rollout(ctx context.Context, c *client.Client, n int64, engines map[string]string, tasks []schema.Task) (*schema.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var res *schema.Result
	var errs [2]error
	wg.Add(2)
	go func() {
		defer wg.Done()
		res, errs[0] = c.Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: engines[schema.RolePlanner]},
			WeightVersion: "planner-v1", Tasks: tasks}, 0)
	}()
	go func() {
		defer wg.Done()
		_, errs[1] = c.Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: engines[schema.RoleActor]},
			WeightVersion: "actor-v1"}, 0)
	}()
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	if res.Status != schema.ResultOK {
		return nil, fmt.Errorf("rollout %d: %s (%s)", n, res.Status, res.Reason)
	}
	return res, nil
}

// asInt reads a number of a sample's metadata (0 when it is none).
func asInt(v any) int {
	n, _ := schema.MetaInt(v)
	return n
}
