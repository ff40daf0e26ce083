package actdispatcher

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// heldGateway is an actor-gateway that starts every generation asked of
// it and answers none until released (from then on it answers at once).
type heldGateway struct {
	mu      sync.Mutex
	asked   []string // the acts whose generation it started, in order
	started chan string
	free    chan struct{}
	once    sync.Once
}

func holdGateway(t *testing.T, url string) *heldGateway {
	t.Helper()
	g := &heldGateway{started: make(chan string, 64), free: make(chan struct{})}
	t.Cleanup(g.release)
	fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
		m := copies[len(copies)-1]
		var req schema.ActorRequest
		if err := schema.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("actor request: %v", err)
			return
		}
		ack(nc, m, schema.ActorStarted, true)
		g.mu.Lock()
		g.asked = append(g.asked, req.Key)
		g.mu.Unlock()
		g.started <- req.Key
		go func() {
			// Word every half second while it generates, as a gateway
			// does: the act does not send its request again.
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-g.free:
					reply, _ := schema.Marshal(&schema.ActorReply{Generation: schema.Generation{
						Text: "out of " + req.Key, PromptIDs: []int{1, 2}, OutputIDs: []int{3}, LogProbs: []float64{-0.5}}})
					r := &nats.Msg{Subject: m.Reply, Header: nats.Header{}, Data: reply}
					r.Header.Set(schema.HdrActorGateway, "fake")
					_ = nc.PublishMsg(r)
					return
				case <-tick.C:
					ack(nc, m, schema.ActorRunning, false)
				}
			}
		}()
	})
	return g
}

func (g *heldGateway) release() { g.once.Do(func() { close(g.free) }) }

// generated are the acts whose generation the gateway started.
func (g *heldGateway) generated() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.asked...)
}

// storeSession records info's rollout (session and tasks) as the
// session-store would, for the handlers that read it.
func storeSession(t *testing.T, s *Service, info *session.Info) {
	t.Helper()
	ctx := context.Background()
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(info.Session.Rollout), &info.Session); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.TasksKey(info.Session.Rollout), &schema.TaskList{Tasks: info.Tasks}); err != nil {
		t.Fatal(err)
	}
}

// finalOutput publishes turn's final planner output of rollout 1's
// episode 0, an answer: what the plan-parser made of it, after it.
func finalOutput(t *testing.T, s *Service, turn int) {
	t.Helper()
	ctx := context.Background()
	if err := s.Bus.Publish(ctx, &schema.PlanOutput{Rollout: 1, Episode: 0, Turn: turn, Text: "<answer>x</answer>"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Bus.Publish(ctx, &schema.PlanAnswer{Rollout: 1, Episode: 0, Turn: turn, Answers: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
}

// handleLast hands the last message on the plan subject subj to the
// replica's handler, as its consumer would.
func handleLast(ctx context.Context, s *Service, subj string) error {
	m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subj)
	if err != nil {
		return err
	}
	return s.handlePlan(ctx, bus.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data, Seq: m.Seq, Time: m.Time, Delivered: 1})
}

// streamedTurn is a service with a rollout that streams its plans stored,
// a gateway that holds the generations it is asked for, and a context of a
// minute: what a test of an abandoned turn starts from.
func streamedTurn(t *testing.T) (*Service, *session.Info, *heldGateway, context.Context) {
	t.Helper()
	s, url := testService(t)
	info := testInfo()
	info.Session.Config.StreamPlans = true
	storeSession(t, s, info)
	g := holdGateway(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return s, info, g, ctx
}

// endDecided waits until the handler of the episode's end has returned
// (ended holds its result) or has recorded the turn's run abandoned: the
// end is decided, now or once the acts it waits for have an outcome.
func endDecided(t *testing.T, s *Service, turn int, ended chan error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if len(ended) > 0 {
			return
		}
		r, _, found, err := bus.GetFresh[schema.Run](context.Background(), s.Bus.Runs, schema.RunKey(1, 0, turn))
		if err != nil {
			t.Fatal(err)
		}
		if found && r.Abandoned != nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the answer's handler neither ended the episode nor recorded its turn abandoned")
}

// listsGenerated checks that the episode's end lists every act whose
// generation the gateway started, each with its outcome and generation
// in the ACT stream: what the session-store makes its actor samples of.
func listsGenerated(t *testing.T, s *Service, g *heldGateway) *schema.EpisodeEnd {
	t.Helper()
	end := episodeEnd(t, s)
	for _, key := range g.generated() {
		if !slices.Contains(end.Acts, key) {
			t.Errorf("act %s was generated, and the episode's end lists only %v: its sample is lost", key, end.Acts)
			continue
		}
		o, err := s.outcome(context.Background(), 1, 0, key)
		if err != nil {
			t.Fatal(err)
		}
		if o == nil || o.Status != schema.ActDoneOK || o.Generation == nil {
			t.Errorf("outcome of act %s: %+v, want done with its generation", key, o)
		}
	}
	return end
}

// A streamed turn whose final output is an answer abandons the acts its
// partial plan released, and one may still be generating then. Its sample
// must count: the episode's end waits for its outcome and lists it, and
// nothing more of the abandoned plan is released meanwhile. Before, the
// end was published at once with the outcomes there were: an act that
// finished after it was not listed, and the session-store never made its
// actor sample (a generation lost, the stats short of it); or the runner,
// finding the answer, cut the act short with no outcome at all, its
// generation run for nothing; and an act that depended on it could be
// released and generated too, after the end.
func TestAnAbandonedActThatEndsAfterTheAnswerIsListed(t *testing.T) {
	t.Parallel()
	s, info, g, ctx := streamedTurn(t)

	running := make(chan error, 1)
	go func() {
		running <- s.handleDAG(ctx, info, msg(5), planDAG(1, true, 1, search("a", "x"), search("b", "y", "a")))
	}()
	if key := <-g.started; key != "t1-a" {
		t.Fatalf("the gateway was asked for %s first, want t1-a", key)
	}
	finalOutput(t, s, 1)
	ended := make(chan error, 1)
	go func() { ended <- handleLast(ctx, s, subject.PlanAnswer(1, 0)) }()
	endDecided(t, s, 1, ended)
	g.release() // a's generation ends after the answer
	if err := <-ended; err != nil {
		t.Fatalf("the answer: %v", err)
	}
	if err := <-running; err != nil {
		t.Fatalf("the runner of the abandoned turn: %v", err)
	}
	end := listsGenerated(t, s, g)
	if want := []string{"t1-a"}; !slices.Equal(g.generated(), want) || !slices.Equal(end.Acts, want) {
		t.Errorf("generated %v, the episode's end lists %v; want %v both: nothing released after the answer", g.generated(), end.Acts, want)
	}
}

// The runner of a streamed turn that stopped (its replica died) while an
// act it released was generating leaves that act without an outcome. Its
// plan message, delivered again after the turn's final output turned out
// an answer, takes the act up (attached to the generation on the gateway,
// or generated again, a retry) until the turn's deadline, and the
// episode's end, which waits for it, lists it. Before, the message was
// dropped as superseded and the end listed what had an outcome then: the
// act and its generation were lost.
func TestAnAbandonedTurnsActIsTakenUpByItsPlanMessageDeliveredAgain(t *testing.T) {
	t.Parallel()
	s, info, g, ctx := streamedTurn(t)
	g.release()

	partial := planDAG(1, true, 1, search("a", "x"))
	if r := record(t, s, info, 5, partial); r.Nodes[0].Status != schema.NodeReleased {
		t.Fatalf("t1-a is %s, want released: the test does not set up what it means to", r.Nodes[0].Status)
	}
	finalOutput(t, s, 1)
	ended := make(chan error, 1)
	go func() { ended <- handleLast(ctx, s, subject.PlanAnswer(1, 0)) }()
	endDecided(t, s, 1, ended)
	if err := s.handleDAG(ctx, info, msg(5), partial); err != nil {
		t.Fatalf("the runner's partial, delivered again: %v", err)
	}
	if err := <-ended; err != nil {
		t.Fatalf("the answer: %v", err)
	}
	if len(g.generated()) == 0 {
		t.Error("the act left without an outcome was not taken up")
	}
	listsGenerated(t, s, g)
}

// An act of an abandoned turn that has no outcome when the turn's deadline
// passes (its runner stopped, and nothing took it up) is recorded failed,
// a time-out, and listed: the episode's end waits no longer, and says what
// became of every act released.
func TestAnAbandonedActWithoutAnOutcomeByTheDeadlineIsRecordedFailed(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	info := testInfo()
	info.Session.Config.StreamPlans = true
	storeSession(t, s, info)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	record(t, s, info, 5, planDAG(1, true, 1, search("a", "x")))
	past := time.Now().Add(-time.Minute).UnixMilli()
	if _, _, err := bus.Mutate(ctx, s.Bus.Runs, schema.RunKey(1, 0, 1), func(r *schema.Run, _ bool) (bool, error) {
		r.Abandoned = &schema.Abandonment{AtMs: past - 1000, UntilMs: past, Why: "the turn's final output is an answer"}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	finalOutput(t, s, 1)
	if err := handleLast(ctx, s, subject.PlanAnswer(1, 0)); err != nil {
		t.Fatalf("the answer: %v", err)
	}
	if end := episodeEnd(t, s); !slices.Equal(end.Acts, []string{"t1-a"}) {
		t.Errorf("the episode's end lists %v, want [t1-a]", end.Acts)
	}
	o, err := s.outcome(ctx, 1, 0, "t1-a")
	if err != nil {
		t.Fatal(err)
	}
	if o == nil || o.Status != schema.ActFailed || o.ErrorKind != schema.ActErrTimeout {
		t.Errorf("outcome of t1-a: %+v, want failed (timeout)", o)
	}
}
