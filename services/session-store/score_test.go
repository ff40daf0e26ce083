package sessionstore

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
)

func init() {
	reward.Register("nonfinite-test", func(_ context.Context, _, answer, _ string) (float64, error) {
		switch answer {
		case "nan":
			return math.NaN(), nil
		case "inf":
			return math.Inf(1), nil
		case "-inf":
			return math.Inf(-1), nil
		}
		return 0.5, nil
	})
}

// endedEpisodes publishes the ends of rollout n's episodes, one per
// answer, each completed, and returns their tasks (one group each).
func endedEpisodes(t *testing.T, s *Service, n int64, answers []string) []schema.Task {
	t.Helper()
	ctx := context.Background()
	tasks := make([]schema.Task, len(answers))
	for e, a := range answers {
		tasks[e] = schema.Task{GroupIndex: e, Index: e, Prompt: "q", Label: "a"}
		end := &schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{a}}
		if err := s.Bus.Publish(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	return tasks
}

// rewardServer answers after each request's wait (nil: it never answers,
// holding the connection), counting the requests and the most in flight.
type rewardServer struct {
	*httptest.Server
	asked, inFlight, most atomic.Int32
}

func newRewardServer(t *testing.T, wait func() <-chan time.Time) *rewardServer {
	rs := &rewardServer{}
	release := make(chan struct{})
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs.asked.Add(1)
		n := rs.inFlight.Add(1)
		defer rs.inFlight.Add(-1)
		for m := rs.most.Load(); n > m && !rs.most.CompareAndSwap(m, n); m = rs.most.Load() {
		}
		var answer <-chan time.Time
		if wait != nil {
			answer = wait()
		}
		select {
		case <-answer:
			w.Write([]byte("0.5"))
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); rs.Close() })
	return rs
}

func shortBudget(t *testing.T, d time.Duration) {
	was := scoreBudget
	scoreBudget = d
	t.Cleanup(func() { scoreBudget = was })
}

// TestSilentRewardServerCostsOneBudget: a reward server that takes
// connections and never answers cost every episode three tries of 30 s,
// one episode after another: 96 minutes for 64 episodes before any result.
// The episodes are scored several at once, and once the server has
// answered nothing for the scoring budget, every episode not scored gets a
// reward error, as a failed reward does, and nothing waits any more.
func TestSilentRewardServerCostsOneBudget(t *testing.T) {
	shortBudget(t, 300*time.Millisecond)
	rs := newRewardServer(t, nil)
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	const n, episodes = 41, 64
	tasks := endedEpisodes(t, s, n, make([]string, episodes))
	cfg := schema.DefaultConfig()
	cfg.Reward = rs.URL
	sess := &schema.Session{Rollout: n, Config: cfg, Episodes: episodes, State: schema.SessionDone, Status: schema.ResultOK, Ended: allEnded(episodes)}

	type gathered struct {
		eps map[int]*episode
		err error
	}
	done := make(chan gathered, 1)
	start := time.Now()
	go func() {
		eps, err := s.gather(context.Background(), sess, tasks, nil, nil)
		done <- gathered{eps, err}
	}()
	var g gathered
	select {
	case g = <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("scoring %d episodes against a silent reward server still waits after 20 s (%d requests so far)", episodes, rs.asked.Load())
	}
	if g.err != nil {
		t.Fatal(g.err)
	}
	for e := range episodes {
		ep := g.eps[e]
		if ep.reward != 0 || !strings.Contains(ep.rewardErr, "the rollout's scoring budget") {
			t.Errorf("episode %d: reward %v, error %q; want 0 and a reward error naming the budget", e, ep.reward, ep.rewardErr)
		}
	}
	if most := rs.most.Load(); most > scorers {
		t.Errorf("%d requests in flight at once; want at most %d", most, scorers)
	}
	if asked := rs.asked.Load(); asked > scorers {
		t.Errorf("%d requests after the budget was spent on the first %d", asked, scorers)
	}
	t.Logf("%d episodes given up in %v", episodes, time.Since(start))
}

// TestSlowRewardServerScoresEveryEpisode: the budget counts silence, not
// work: a server that takes its time but answers scores every episode,
// several at once, even when all of them take longer than the budget; and
// an episode its group's verdict scored is not asked again.
func TestSlowRewardServerScoresEveryEpisode(t *testing.T) {
	shortBudget(t, 300*time.Millisecond)
	rs := newRewardServer(t, func() <-chan time.Time { return time.After(100 * time.Millisecond) })
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	const n, episodes = 42, 64
	tasks := endedEpisodes(t, s, n, make([]string, episodes))
	cfg := schema.DefaultConfig()
	cfg.Reward = rs.URL
	sess := &schema.Session{Rollout: n, Config: cfg, Episodes: episodes, State: schema.SessionDone, Status: schema.ResultOK,
		Groups: []schema.GroupState{{Index: 0, State: schema.GroupDelivered, Scores: []schema.EpisodeScore{{Episode: 0, Reward: 0.25}}}}, Ended: allEnded(episodes)}
	eps, err := s.gather(context.Background(), sess, tasks, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for e := range episodes {
		want := 0.5
		if e == 0 {
			want = 0.25 // as recorded
		}
		if ep := eps[e]; ep.reward != want || ep.rewardErr != "" {
			t.Errorf("episode %d: reward %v, error %q; want %v", e, ep.reward, ep.rewardErr, want)
		}
	}
	if asked := rs.asked.Load(); asked != episodes-1 {
		t.Errorf("the server was asked %d times; want %d (the recorded episode is not asked again)", asked, episodes-1)
	}
	if most := rs.most.Load(); most < 2 || most > scorers {
		t.Errorf("%d requests in flight at once at most; want 2 to %d", most, scorers)
	}
}

// TestNonFiniteRewardIsAnError: NaN or ±Inf from a reward function went
// into the samples, the means and the group filter as a reward; it is a
// reward error (the episode scores 0, and says why).
func TestNonFiniteRewardIsAnError(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	const n = 43
	answers := []string{"nan", "inf", "-inf", "fine"}
	tasks := endedEpisodes(t, s, n, answers)
	cfg := schema.DefaultConfig()
	cfg.Reward = "nonfinite-test"
	sess := &schema.Session{Rollout: n, Config: cfg, Episodes: len(tasks), State: schema.SessionDone, Status: schema.ResultOK, Ended: allEnded(len(tasks))}
	eps, err := s.gather(context.Background(), sess, tasks, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for e, a := range answers {
		ep := eps[e]
		if a == "fine" {
			if ep.reward != 0.5 || ep.rewardErr != "" {
				t.Errorf("%s: reward %v, error %q; want 0.5", a, ep.reward, ep.rewardErr)
			}
			continue
		}
		if ep.reward != 0 || !strings.Contains(ep.rewardErr, "is not a finite number") {
			t.Errorf("%s: reward %v, error %q; want 0 and a reward error", a, ep.reward, ep.rewardErr)
		}
	}
}

// TestGroupFilterRequestThatCannotBeEncoded: a reward JSON cannot carry
// (NaN, recorded before rewards were checked) made the filter's request
// fail to encode, and the filter was POSTed an empty body, its verdict
// taken. The filter is not asked, and the group is kept saying why.
func TestGroupFilterRequestThatCannotBeEncoded(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Write([]byte(`{"keep": false, "reason": "asked with nothing"}`))
	}))
	defer srv.Close()
	cfg := schema.DefaultConfig()
	cfg.GroupFilter = srv.URL
	sess := &schema.Session{Rollout: 44, Config: cfg}
	eps := map[int]*episode{}
	for e, r := range []float64{math.NaN(), 1} {
		eps[e] = &episode{task: schema.Task{Prompt: "q", Label: "a"}, end: &schema.EpisodeEnd{Status: schema.EpisodeCompleted, Answers: []string{"a"}}, reward: r,
			planner: &schema.Sample{Reward: r}}
	}
	s := &Service{}
	_, _, err := s.remoteFilter(context.Background(), srv.URL, sess, 0, []int{0, 1}, eps, []float64{math.NaN(), 1})
	if err == nil || !strings.Contains(err.Error(), "encode the request for group 0") {
		t.Errorf("remoteFilter: %v; want an error saying the request cannot be encoded", err)
	}
	gs := s.filter(context.Background(), sess, 0, []int{0, 1}, eps)
	if gs.State != schema.GroupDelivered || !strings.Contains(gs.Reason, "kept: the group filter could not be asked: encode the request") {
		t.Errorf("group %+v; want it kept, saying the filter could not be asked", gs)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the filter was asked %d times", n)
	}
}

// TestSilentRewardServerCostsTheRolloutOneBudget: the scoring budget is
// the rollout's. A rollout scores in many passes (each group as it is
// decided), and a server silent for a whole budget in one cost every later
// pass a whole budget again: a minute per group. Once one pass spent it,
// the rollout's later passes have a short one, and say why; a score that
// comes gives the whole budget back. Other rollouts, and a later rollout
// of the number, are not touched.
func TestSilentRewardServerCostsTheRolloutOneBudget(t *testing.T) {
	shortBudget(t, 1200*time.Millisecond)
	var answering atomic.Bool
	rs := newRewardServer(t, func() <-chan time.Time {
		if answering.Load() {
			return time.After(0)
		}
		return nil // silent: holds the request
	})
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	const n = 43
	tasks := endedEpisodes(t, s, n, make([]string, 9))
	cfg := schema.DefaultConfig()
	cfg.Reward = rs.URL
	sess := &schema.Session{Rollout: n, CreatedMs: 1000, Config: cfg, Episodes: len(tasks), State: schema.SessionRunning, Ended: allEnded(len(tasks))}
	pass := func(which ...int) map[int]*episode {
		t.Helper()
		eps, err := s.gather(context.Background(), sess, tasks, which, nil)
		if err != nil {
			t.Fatal(err)
		}
		return eps
	}
	whole := "no score came for 1.2s, the rollout's scoring budget"
	for e, ep := range pass(0, 1, 2) {
		if !strings.Contains(ep.rewardErr, whole) || strings.Contains(ep.rewardErr, "short") {
			t.Errorf("first pass, episode %d: reward error %q; want the whole budget spent", e, ep.rewardErr)
		}
	}
	short := "no score came for 100ms, the rollout's scoring budget (short: the reward server answered nothing for a whole budget of 1.2s earlier in this rollout)"
	for e, ep := range pass(3, 4, 5) {
		if !strings.Contains(ep.rewardErr, short) {
			t.Errorf("second pass, episode %d: reward error %q; want %q", e, ep.rewardErr, short)
		}
	}
	other := *sess
	other.Rollout = n + 1
	again := *sess
	again.CreatedMs++ // the number used again by a later training run
	for _, v := range []*schema.Session{&other, &again} {
		if b, why := s.silent.budget(v); b != scoreBudget || why != "" {
			t.Errorf("rollout %d created %d: budget %v (%q); want the whole %v", v.Rollout, v.CreatedMs, b, why, scoreBudget)
		}
	}
	// The server answers again: scored, and the whole budget is back.
	answering.Store(true)
	for e, ep := range pass(6, 7, 8) {
		if ep.rewardErr != "" || ep.reward != 0.5 {
			t.Errorf("third pass, episode %d: reward %v, error %q; want 0.5 from the server back", e, ep.reward, ep.rewardErr)
		}
	}
	if b, why := s.silent.budget(sess); b != scoreBudget || why != "" {
		t.Errorf("after a score came: budget %v (%q); want the whole %v", b, why, scoreBudget)
	}
}
