package bus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/freeport"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

func TestProvisionIsIdempotent(t *testing.T) {
	_, url := bustest.Server(t)
	ctx := context.Background()
	b := bustest.Bus(t, url, "first")
	if err := b.Publish(ctx, &schema.Status{Rollout: 1, Event: "x", Episode: -1}); err != nil {
		t.Fatal(err)
	}
	before := streamState(t, b)
	// A second service starting provisions again: nothing may change.
	b2 := bustest.Bus(t, url, "second")
	after := streamState(t, b2)
	for name, s := range before {
		a := after[name]
		if a.created != s.created || a.msgs != s.msgs || a.config != s.config {
			t.Errorf("stream %s changed by provisioning twice: %+v -> %+v", name, s, a)
		}
	}
	if got := before[bus.StreamRollout].msgs; got != 1 {
		t.Errorf("ROLLOUT holds %d messages, want 1", got)
	}
	for _, bucket := range []string{bus.BucketSession, bus.BucketRuns} {
		kv, err := b2.JS.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatalf("kv %s: %v", bucket, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.TTL() <= 0 || st.LimitMarkerTTL() <= 0 {
			t.Errorf("kv %s: ttl %v, limit markers %v; both must be set so expiry is seen", bucket, st.TTL(), st.LimitMarkerTTL())
		}
	}
}

// Provisioning what is already as wanted sends no update: an update is not
// a no-op on the server (it rewrites the stream's config, racing with the
// consumers other replicas create), and a limit the config leaves unset
// (0) is stored as -1, which must read as the same.
func TestProvisionAgainUpdatesNothing(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Provision(t, url)
	watch := bustest.Conn(t, url)
	updates, err := watch.SubscribeSync("$JS.API.STREAM.UPDATE.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	bustest.Provision(t, url)
	// Every request of the provisioning was answered, so a copy of each
	// was queued to watch before this flush's answer.
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	n, _, err := updates.Pending()
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		m, err := updates.NextMsg(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Errorf("provisioning again updated what was as wanted: %s", m.Subject)
	}
}

type streamSnap struct {
	created time.Time
	msgs    uint64
	config  string
}

func streamState(t *testing.T, b *bus.Bus) map[string]streamSnap {
	t.Helper()
	out := map[string]streamSnap{}
	for _, name := range []string{bus.StreamRollout, bus.StreamPlan, bus.StreamAct} {
		s, err := b.JS.Stream(context.Background(), name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		c := info.Config
		out[name] = streamSnap{created: info.Created, msgs: info.State.Msgs,
			config: fmt.Sprintf("%v %v %v %v %v", c.Subjects, c.MaxAge, c.Duplicates, c.Storage, c.AllowMsgSchedules)}
	}
	return out
}

func TestPublishIsIdempotentByMsgID(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	m := &schema.ActDone{Rollout: 3, Episode: 1, Turn: 1, Key: "t1-s1", Status: schema.ActDoneOK}
	for i := 0; i < 3; i++ {
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := b.JS.Stream(ctx, bus.StreamAct)
	info, _ := s.Info(ctx)
	if info.State.Msgs != 1 {
		t.Errorf("3 publishes of one message stored %d times", info.State.Msgs)
	}
}

// TestConsumeMapsErrors: nil acks, a transient error is redelivered, a
// permanent or invalid one is terminated, a panic is terminated, and a
// message failing every time is given up after MaxDeliver.
func TestConsumeMapsErrors(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	calls := map[string]int{}
	h := func(_ context.Context, m bus.Msg) error {
		var st schema.Status
		if err := m.Decode(&st); err != nil {
			return err
		}
		mu.Lock()
		calls[st.Event]++
		n := calls[st.Event]
		mu.Unlock()
		switch st.Event {
		case "ok":
			return nil
		case "flaky": // fails twice, then works
			if n <= 2 {
				return fail.Transientf("flaky %d", n)
			}
			return nil
		case "permanent":
			return fail.Permanentf("never")
		case "invalid":
			return fail.Invalidf("bad")
		case "panic":
			panic("boom")
		case "always":
			return errors.New("plain errors are retried")
		}
		return nil
	}
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(ctx, bus.Consumer{
			Stream: bus.StreamRollout, Durable: "test", Filters: []string{"rollout.*.status"},
			MaxDeliver: 4, Backoff: func(uint64) time.Duration { return 10 * time.Millisecond },
		}, h)
	}()
	for i, ev := range []string{"ok", "flaky", "permanent", "invalid", "panic", "always"} {
		if err := b.Publish(ctx, &schema.Status{Rollout: int64(i), Event: ev, Episode: -1}); err != nil {
			t.Fatal(err)
		}
	}
	// A body that is not msgpack at all is invalid input: terminated.
	if _, err := b.JS.Publish(ctx, "rollout.99.status", []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"ok": 1, "flaky": 3, "permanent": 1, "invalid": 1, "panic": 1, "always": 4}
	deadline := time.Now().Add(20 * time.Second)
	for {
		cons, err := b.JS.Consumer(ctx, bus.StreamRollout, "test")
		if errors.Is(err, jetstream.ErrConsumerNotFound) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // Consume has not created it yet
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := fmt.Sprint(calls)
		settled := info.NumAckPending == 0 && info.NumPending == 0 && calls["always"] >= 4 && calls["flaky"] >= 3
		mu.Unlock()
		if settled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("messages not settled: calls %s, ack pending %d", got, info.NumAckPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for ev, n := range want {
		if calls[ev] != n {
			t.Errorf("%s: handled %d times, want %d", ev, calls[ev], n)
		}
	}
}

// TestMutateUnderContention: many writers incrementing one key by
// compare-and-set lose no update.
func TestMutateUnderContention(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	const writers, each = 8, 10
	var wrote atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				_, ok, err := bus.Mutate(ctx, b.Sessions, "counter", func(v *schema.Session, exists bool) (bool, error) {
					v.Episodes++
					return true, nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					wrote.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	v, _, _, err := bus.Get[schema.Session](ctx, b.Sessions, "counter")
	if err != nil {
		t.Fatal(err)
	}
	if v.Episodes != writers*each || wrote.Load() != writers*each {
		t.Errorf("counter %d after %d writes (%d reported), want %d", v.Episodes, writers*each, wrote.Load(), writers*each)
	}
	created, err := bus.Create(ctx, b.Sessions, "counter", &schema.Session{})
	if err != nil || created {
		t.Errorf("Create on an existing key: created %v err %v, want false nil", created, err)
	}
}

// TestMutateFrom: from a value and its revision the write needs no read;
// when another writer came in between, the key is read again and the
// change applied to what is there; the caller's value is not changed.
func TestMutateFrom(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	held, rev, _, err := bus.MutateRev(ctx, b.Sessions, "from", func(v *schema.Session, _ bool) (bool, error) {
		v.Outbox = []string{"a", "b"}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	reads := func() float64 {
		return testutil.ToFloat64(telemetry.KVOps.WithLabelValues(bus.BucketSession, "get")) +
			testutil.ToFloat64(telemetry.KVOps.WithLabelValues(bus.BucketSession, "get_fresh"))
	}
	settleA := func(v *schema.Session, _ bool) (bool, error) { return v.Settle("a"), nil }
	before := reads()
	v, rev2, wrote, err := bus.MutateFrom(ctx, b.Sessions, "from", held, rev, settleA)
	if err != nil || !wrote || len(v.Outbox) != 1 || rev2 <= rev {
		t.Fatalf("MutateFrom: %+v rev %d wrote %v err %v", v.Outbox, rev2, wrote, err)
	}
	if got := reads() - before; got != 0 {
		t.Errorf("%v reads for a write from a known revision, want 0", got)
	}
	if len(held.Outbox) != 2 {
		t.Errorf("the caller's value changed: %v", held.Outbox)
	}
	// Another writer: the held revision is old; the change lands on the
	// value that is there.
	if _, _, err := bus.Mutate(ctx, b.Sessions, "from", func(v *schema.Session, _ bool) (bool, error) {
		v.Outbox = append(v.Outbox, "c")
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	held.Outbox = []string{"a", "b", "x"}
	v, _, wrote, err = bus.MutateFrom(ctx, b.Sessions, "from", held, rev2, func(v *schema.Session, _ bool) (bool, error) { return v.Settle("b"), nil })
	if err != nil || !wrote || fmt.Sprint(v.Outbox) != "[c]" {
		t.Fatalf("after a conflict: %v wrote %v err %v, want [c] (b settled on the stored value)", v.Outbox, wrote, err)
	}
}

func TestLastMsg(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	for e := 0; e < 3; e++ {
		for turn := 1; turn <= 2; turn++ {
			if err := b.Publish(ctx, &schema.PlanOutput{Rollout: 5, Episode: e, Turn: turn}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Publish(ctx, &schema.PlanRequest{Rollout: 5, Episode: 1, Turn: 3}); err != nil {
		t.Fatal(err)
	}
	turnOf := func(m *bus.StoredMsg) int {
		t.Helper()
		var o schema.PlanOutput
		if err := schema.Unmarshal(m.Data, &o); err != nil {
			var r schema.PlanRequest
			if err := schema.Unmarshal(m.Data, &r); err != nil {
				t.Fatal(err)
			}
			return r.Turn
		}
		return o.Turn
	}
	m, err := b.LastMsg(ctx, bus.StreamPlan, "plan.5.out.2")
	if err != nil || m == nil || turnOf(m) != 2 || m.Subject != "plan.5.out.2" || m.Header.Get(schema.HdrSchema) != "plan.out/1" {
		t.Fatalf("last on plan.5.out.2: %+v %v, want turn 2 with its headers", m, err)
	}
	// A filter names the last message of any subject it matches.
	m, err = b.LastMsg(ctx, bus.StreamPlan, "plan.5.*.1")
	if err != nil || m == nil || m.Subject != "plan.5.req.1" || turnOf(m) != 3 {
		t.Fatalf("last on plan.5.*.1: %+v %v, want the turn-3 request", m, err)
	}
	if m, err := b.LastMsg(ctx, bus.StreamPlan, "plan.77.out.0"); m != nil || err != nil {
		t.Errorf("nothing there: %+v %v, want nil nil", m, err)
	}
	if _, err := b.LastMsg(ctx, "NOSUCH", "x"); err == nil {
		t.Errorf("unknown stream: no error")
	}
}

func TestPublishOnce(t *testing.T) {
	_, url := bustest.Server(t)
	ctx := context.Background()
	// A short duplicate window, so that the second outcome below is not
	// dropped as a duplicate of the first but refused for its subject.
	const window = 100 * time.Millisecond
	if err := bus.Provision(ctx, bustest.Conn(t, url), bustest.Logger(), bus.Provisioning{DupeWindow: window}); err != nil {
		t.Fatal(err)
	}
	b, err := bus.Connect(ctx, bus.ConnOptions{URL: url}, "t", bustest.Logger(), bus.Provisioning{DupeWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	first := &schema.ActDone{Rollout: 3, Episode: 0, Turn: 1, Key: "t1-s1", Status: schema.ActDoneOK, Output: "Paris"}
	stored, err := b.PublishOnce(ctx, first)
	if err != nil || !stored {
		t.Fatalf("first outcome: stored %v err %v", stored, err)
	}
	// Another replica ran the same act: its outcome is refused, whatever
	// its message id (so beyond the duplicate window too), and the first
	// one stays.
	second := *first
	second.Output, second.Attempts = "Lyon", 2
	time.Sleep(3 * window) // the window is over: only the subject check is left
	stored, err = b.PublishOnce(ctx, &second)
	if err != nil || stored {
		t.Fatalf("a second outcome: stored %v err %v, want refused", stored, err)
	}
	m, err := b.LastMsg(ctx, bus.StreamAct, first.Subject())
	var d schema.ActDone
	if err != nil || schema.Unmarshal(m.Data, &d) != nil || d.Output != "Paris" {
		t.Fatalf("the stream holds %+v (%v), want the first outcome", d, err)
	}
}

func TestPurgeAndRepublish(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	for e := 0; e < 2; e++ {
		if err := b.Publish(ctx, &schema.PlanRequest{Rollout: 8, Episode: e, Turn: 1}); err != nil {
			t.Fatal(err)
		}
	}
	m, _ := b.LastMsg(ctx, bus.StreamPlan, "plan.8.req.1")
	// Published again under its own id, the duplicate window drops it; with
	// a suffix it is stored again, headers and body as they were.
	if err := b.Republish(ctx, m, "w1"); err != nil {
		t.Fatal(err)
	}
	again, _ := b.LastMsg(ctx, bus.StreamPlan, "plan.8.req.1")
	if again.Seq == m.Seq || string(again.Data) != string(m.Data) || again.Header.Get("Nats-Msg-Id") != m.Header.Get("Nats-Msg-Id")+".w1" ||
		again.Header.Get(schema.HdrEpisode) != "1" {
		t.Fatalf("republished: %+v", again)
	}
	// planact's history cannot be purged, by anyone: only TIMEOUT, where
	// the session-store cancels its time-outs, can.
	if err := b.Purge(ctx, bus.StreamPlan, "plan.8.>"); err == nil {
		t.Errorf("PLAN was purged")
	}
	if err := b.Publish(ctx, &schema.Timeout{Rollout: 8, TimeoutKind: schema.TimeoutRollout, DeadlineMs: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.Purge(ctx, bus.StreamTimeout, "rollout.8.schedule.>"); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.LastMsg(ctx, bus.StreamTimeout, "rollout.8.>"); m != nil {
		t.Errorf("purged, yet %s is there", m.Subject)
	}
}

func TestPublishAll(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	var ms []schema.Message
	for i := 0; i < 100; i++ {
		ms = append(ms, &schema.ActDone{Rollout: 9, Episode: i % 10, Turn: 1, Key: fmt.Sprintf("t1-s%d", i/10), Status: schema.ActDoneOK})
	}
	ms = append(ms, ms[:10]...) // duplicates are dropped by message id
	if err := b.PublishAll(ctx, ms...); err != nil {
		t.Fatal(err)
	}
	s, _ := b.JS.Stream(ctx, bus.StreamAct)
	info, _ := s.Info(ctx)
	if info.State.Msgs != 100 {
		t.Errorf("stored %d messages, want 100", info.State.Msgs)
	}
}

func TestRolloutTraceIDMatchesThePythonExample(t *testing.T) {
	// examples/python/trainer.py: sha256(f"planact-rollout-{rollout}").hexdigest()[:32]
	if got := bus.RolloutTraceID(7); got != "44865295074b33ac1928b49b055f9bea" {
		t.Errorf("trace id %q", got)
	}
}

// TestTraceparentNamesTheMessagesPlaceInTheRollout: a message's traceparent
// carries the rollout's trace id and, as parent, the span of its turn (its
// episode's, the rollout's), the same for every message of that place and
// however often it is published.
func TestTraceparentNamesTheMessagesPlaceInTheRollout(t *testing.T) {
	trace := bus.RolloutTraceID(7)
	ctx := bus.WithTrace(context.Background(), trace)
	for _, c := range []struct {
		m             schema.Message
		episode, turn int
	}{
		{&schema.PlanRequest{Rollout: 7, Episode: 2, Turn: 3}, 2, 3},
		{&schema.PlanDAG{Rollout: 7, Episode: 2, Turn: 3}, 2, 3},
		{&schema.ActDone{Rollout: 7, Episode: 2, Turn: 3, Key: "t3-s1"}, 2, 3},
		{&schema.EpisodeEnd{Rollout: 7, Episode: 2}, 2, 0},
		{&schema.Start{Rollout: 7}, -1, 0},
	} {
		msg, err := bus.NewMsg(ctx, c.m)
		if err != nil {
			t.Fatal(err)
		}
		tp := msg.Header.Get(schema.HdrTraceparent)
		want := telemetry.SpanOf(trace, 7, c.episode, c.turn)
		if wantTP := "00-" + trace + "-" + want.SpanID().String() + "-01"; tp != wantTP {
			t.Errorf("%s: traceparent %q, want %q", c.m.Kind(), tp, wantTP)
		}
	}
	a, b := telemetry.SpanOf(trace, 7, 2, 3), telemetry.SpanOf(trace, 7, 2, 4)
	if a.SpanID() == b.SpanID() || a.SpanID() == telemetry.SpanOf(trace, 7, 2, 0).SpanID() {
		t.Error("turns and their episode share a span id")
	}
	if msg, _ := bus.NewMsg(context.Background(), &schema.Start{Rollout: 7}); msg.Header.Get(schema.HdrTraceparent) != "" {
		t.Error("a message outside any trace got a traceparent")
	}
}

// TestMessagesWaitingForASlotAreNotRedelivered: with fewer handler slots
// than messages and handlers longer than the ack wait, every message is
// handled once: none waits unseen in the client, to be handed out again
// when its ack wait runs out.
func TestMessagesWaitingForASlotAreNotRedelivered(t *testing.T) {
	for _, slots := range []int{1, 3} {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			_, url := bustest.Server(t)
			b := bustest.Bus(t, url, "t")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			n := 3*slots + 1
			for i := 0; i < n; i++ {
				if err := b.Publish(ctx, &schema.Status{Rollout: int64(i), Event: "slow", Episode: -1}); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			handled := map[int64]int{}
			running, most := 0, 0
			done := make(chan error, 1)
			go func() {
				done <- b.Consume(ctx, bus.Consumer{Stream: bus.StreamRollout, Durable: "slow", Filters: []string{"rollout.*.status"},
					Concurrency: slots, AckWait: 400 * time.Millisecond}, func(_ context.Context, m bus.Msg) error {
					var st schema.Status
					if err := m.Decode(&st); err != nil {
						return err
					}
					mu.Lock()
					handled[st.Rollout]++
					running++
					most = max(most, running)
					mu.Unlock()
					time.Sleep(700 * time.Millisecond) // longer than the ack wait
					mu.Lock()
					running--
					mu.Unlock()
					return nil
				})
			}()
			settle(t, b, "slow", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(handled) == n
			})
			cancel()
			<-done
			for r, k := range handled {
				if k != 1 {
					t.Errorf("message %d handled %d times", r, k)
				}
			}
			if most > slots {
				t.Errorf("%d handlers ran at once, with %d slots", most, slots)
			}
		})
	}
}

// settle waits until cond holds and the consumer durable has nothing
// pending or unacknowledged.
func settle(t *testing.T, b *bus.Bus, durable string, cond func() bool) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cons, err := b.JS.Consumer(ctx, bus.StreamRollout, durable)
		if err == nil && cond() {
			if info, err := cons.Info(ctx); err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s did not settle", durable)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// consumeStatuses runs a consumer of rollout.*.status on b until the test
// ends, recording which replica handled which message, and how many times
// JetStream had delivered it by then.
type handledBy struct {
	mu        sync.Mutex
	by        map[int64][]string // rollout -> replicas that handled it
	delivered map[int64]uint64   // rollout -> its delivery count when last handled
}

func newHandledBy() *handledBy {
	return &handledBy{by: map[int64][]string{}, delivered: map[int64]uint64{}}
}

func (hb *handledBy) consume(t *testing.T, b *bus.Bus, replica string, c bus.Consumer, work func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		done <- b.Consume(ctx, c, func(hctx context.Context, m bus.Msg) error {
			var st schema.Status
			if err := m.Decode(&st); err != nil {
				return err
			}
			hb.mu.Lock()
			hb.by[st.Rollout] = append(hb.by[st.Rollout], replica)
			hb.delivered[st.Rollout] = m.Delivered
			hb.mu.Unlock()
			if work != nil {
				work(hctx)
			}
			return nil
		})
	}()
}

func (hb *handledBy) count(replica string) (n int) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	for _, by := range hb.by {
		for _, r := range by {
			if r == replica {
				n++
			}
		}
	}
	return n
}

func publishStatuses(t *testing.T, b *bus.Bus, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if err := b.Publish(context.Background(), &schema.Status{Rollout: int64(i), Event: "work", Episode: -1}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFirstWriteAfterProvisioning: on a fresh server, a trainer that opens
// the task store the moment it exists (as pkg/client does while planact
// starts) and a service holding the provisioned store both write at once,
// with no retry, and both writes succeed. The store used to be created
// with direct gets on and switched off after: a handle opened in between
// asked for direct gets that nobody answered ("no responders").
func TestFirstWriteAfterProvisioning(t *testing.T) {
	ctx := context.Background()
	for i := range 24 {
		_, url := bustest.Server(t)
		js, err := jetstream.New(bustest.Conn(t, url))
		if err != nil {
			t.Fatal(err)
		}
		provisioned := make(chan *bus.Bus, 1)
		go func() {
			var b *bus.Bus
			err := bus.Provision(ctx, bustest.Conn(t, url), bustest.Logger(), bus.Provisioning{})
			if err == nil {
				b, err = bus.Connect(ctx, bus.ConnOptions{URL: url}, "svc", bustest.Logger(), bus.Provisioning{})
			}
			if err != nil {
				t.Error(err)
			}
			provisioned <- b
		}()
		var store jetstream.ObjectStore
		for deadline := time.Now().Add(30 * time.Second); ; {
			if store, err = js.ObjectStore(ctx, bus.ObjectTasks(schema.RolePlanner)); err == nil {
				break
			}
			// Not there yet, or a request that timed out while the server
			// was busy creating streams (once under a CPU hog): ask again.
			notYet := errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
			if !notYet || time.Now().After(deadline) {
				t.Fatalf("start %d: open the task store: %v", i, err)
			}
		}
		b := <-provisioned
		if b == nil {
			t.FailNow()
		}
		t.Cleanup(b.Close)
		if _, err := store.PutBytes(ctx, "trainer", []byte("tasks")); err != nil {
			t.Errorf("start %d: the trainer's first write: %v", i, err)
		}
		if _, err := b.Tasks[schema.RolePlanner].PutBytes(ctx, "service", []byte("tasks")); err != nil {
			t.Errorf("start %d: the service's first write: %v", i, err)
		}
		if got, err := store.GetBytes(ctx, "service"); err != nil || string(got) != "tasks" {
			t.Errorf("start %d: read back: %q, %v", i, got, err)
		}
	}
}

// TestABusyReplicaTakesNoMoreThanItCanRun: replica A's only slot is taken
// by a handler that does not end; everything published after goes to
// replica B, which is idle, instead of waiting at A.
func TestABusyReplicaTakesNoMoreThanItCanRun(t *testing.T) {
	_, url := bustest.Server(t)
	a, b := bustest.Bus(t, url, "a"), bustest.Bus(t, url, "b")
	c := bus.Consumer{Stream: bus.StreamRollout, Durable: "shared", Filters: []string{"rollout.*.status"}, AckWait: time.Second}
	hb := newHandledBy()
	release := make(chan struct{})
	ca := c
	ca.Concurrency = 2
	hb.consume(t, a, "a", ca, func(ctx context.Context) {
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	publishStatuses(t, a, 0, 2)
	eventuallyBus(t, "A's slots taken", func() bool { return hb.count("a") == 2 })
	cb := c
	cb.Concurrency = 4
	hb.consume(t, b, "b", cb, nil)
	publishStatuses(t, a, 2, 10)
	eventuallyBus(t, "B handled what A could not run", func() bool { return hb.count("b") == 10 })
	close(release)
	settle(t, a, "shared", func() bool { return hb.count("a") == 2 })
	hb.mu.Lock()
	defer hb.mu.Unlock()
	for r, by := range hb.by {
		if len(by) != 1 {
			t.Errorf("message %d handled by %v", r, by)
		}
	}
}

// TestAFrozenReplicaHoldsAMessageOnce: replica A stops (its connection
// goes silent, as SIGSTOP does to a process) with slots free. What it had
// asked for is delivered to it and goes to replica B after the ack wait;
// no message is given to the frozen replica a second time (its requests
// expire within the ack wait), so work moves on within one ack wait.
func TestAFrozenReplicaHoldsAMessageOnce(t *testing.T) {
	_, url := bustest.Server(t)
	proxy := bustest.StartProxy(t, url)
	a, b := bustest.Bus(t, proxy.URL, "a"), bustest.Bus(t, url, "b")
	c := bus.Consumer{Stream: bus.StreamRollout, Durable: "shared", Filters: []string{"rollout.*.status"}, AckWait: 500 * time.Millisecond, Concurrency: 64}
	hb := newHandledBy()
	hb.consume(t, a, "a", c, nil)
	publishStatuses(t, a, 0, 1)
	settle(t, b, "shared", func() bool { return hb.count("a") == 1 }) // A is consuming, and its ack went out
	hb.consume(t, b, "b", c, nil)
	proxy.Freeze()
	const n = 40
	publishStatuses(t, b, 1, n)
	settle(t, b, "shared", func() bool { return hb.count("b") == n })
	hb.mu.Lock()
	defer hb.mu.Unlock()
	held := 0
	for r, d := range hb.delivered {
		if d > 1 {
			held++
		}
		if d > 2 {
			t.Errorf("message %d was delivered %d times before it was handled: the frozen replica took it more than once", r, d)
		}
	}
	t.Logf("%d of %d messages went to the frozen replica first", held, n)
}

// TestSlotsChangeWhileConsuming: a consumer's limit raised while it runs
// lets more handlers run at once; lowered, no more run than the new limit
// once those running have finished.
func TestSlotsChangeWhileConsuming(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	slots := bus.NewSlots(1)
	h := newHeld()
	hb := newHandledBy()
	hb.consume(t, b, "b", bus.Consumer{Stream: bus.StreamRollout, Durable: "slots", Filters: []string{"rollout.*.status"}, Slots: slots}, h.work)
	publishStatuses(t, b, 0, 6)
	eventuallyBus(t, "one handler", func() bool { return hb.count("b") == 1 })
	slots.SetLimit(4)
	eventuallyBus(t, "four handlers", func() bool { return hb.count("b") == 4 })
	if most := h.takeMost(); most != 4 {
		t.Errorf("%d handlers at once with a limit of 4", most)
	}
	slots.SetLimit(1)
	close(h.release)
	settle(t, b, "slots", func() bool { return hb.count("b") == 6 })
	if most := h.takeMost(); most > 1 {
		t.Errorf("%d handlers at once after the limit went down to 1", most)
	}
}

func eventuallyBus(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestALongHandlerKeepsItsMessage: a handler that runs for several ack
// waits keeps its message (in progress, told to JetStream within each ack
// wait): it is delivered once, and handled once.
func TestALongHandlerKeepsItsMessage(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "a")
	c := bus.Consumer{Stream: bus.StreamRollout, Durable: "long", Filters: []string{"rollout.*.status"}, AckWait: time.Second, Concurrency: 4}
	hb := newHandledBy()
	hb.consume(t, b, "a", c, func(ctx context.Context) {
		select {
		case <-time.After(5 * c.AckWait / 2): // past two ack waits: the message would go again without in-progress
		case <-ctx.Done():
		}
	})
	publishStatuses(t, b, 0, 3)
	settle(t, b, "long", func() bool { return hb.count("a") == 3 })
	hb.mu.Lock()
	defer hb.mu.Unlock()
	for r, by := range hb.by {
		if len(by) != 1 || hb.delivered[r] != 1 {
			t.Errorf("message %d handled %d times, delivered %d times; want once", r, len(by), hb.delivered[r])
		}
	}
}

// TestConsumeWaitsForNATS: a service that opens its consumer while NATS is
// down (restarting) waits for NATS and then consumes. It used to fail, and
// one failed service stops every other of `planact up`: a rollout in
// flight across a restart of NATS then never ended.
func TestConsumeWaitsForNATS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The server comes back on its port seven seconds later: a port from
	// the kernel's ephemeral range may meanwhile be any connection's local
	// port, and the restart would fail with "address already in use".
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Start(embedded.Options{Dir: dir, Port: port, Name: "restarting"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	url := srv.ClientURL()
	b := bustest.Bus(t, url, "t")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := bus.Consumer{Stream: bus.StreamRollout, Durable: "late", Filters: []string{"rollout.*.status"}}
	if err := b.EnsureConsumer(ctx, c); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	got := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(ctx, c, func(_ context.Context, m bus.Msg) error {
			select {
			case got <- m.Subject:
			default:
			}
			return nil
		})
	}()
	// Down for longer than a JetStream request's time-out (5s), so that the
	// first request for the consumer fails.
	select {
	case err := <-done:
		t.Fatalf("Consume gave up while NATS was down: %v", err)
	case <-time.After(7 * time.Second):
	}
	if srv, err = embedded.Start(embedded.Options{Dir: dir, Port: port, Name: "restarting"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, &schema.Status{Rollout: 5, Event: "back", Episode: -1}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "rollout.5.status" {
			t.Errorf("handled %s, want rollout.5.status", s)
		}
	case err := <-done:
		t.Fatalf("Consume ended after NATS came back: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("nothing consumed within a minute of NATS coming back")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Consume: %v", err)
	}
}

// MutateNew writes a key it guesses absent without reading it first; a
// wrong guess costs a read and changes nothing of what is written.
func TestMutateNew(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	reads := func() float64 {
		return testutil.ToFloat64(telemetry.KVOps.WithLabelValues(bus.BucketRuns, "get")) +
			testutil.ToFloat64(telemetry.KVOps.WithLabelValues(bus.BucketRuns, "get_fresh"))
	}
	conflicts := func() float64 { return testutil.ToFloat64(telemetry.KVConflicts.WithLabelValues(bus.BucketRuns)) }
	var sawExisting []bool
	claim := func(runner uint64) func(r *schema.Run, exists bool) (bool, error) {
		return func(r *schema.Run, exists bool) (bool, error) {
			sawExisting = append(sawExisting, exists)
			if exists {
				r.Turn++ // a second plan of the turn: the state it finds goes on
				return true, nil
			}
			r.Runner, r.Turn = runner, 1
			return true, nil
		}
	}
	r0, c0 := reads(), conflicts()
	v, rev, wrote, err := bus.MutateNew(ctx, b.Runs, "1.0.1", claim(7))
	if err != nil || !wrote || v.Runner != 7 || rev == 0 {
		t.Fatalf("an absent key: %+v rev %d wrote %v err %v", v, rev, wrote, err)
	}
	if got := reads() - r0; got != 0 || fmt.Sprint(sawExisting) != "[false]" {
		t.Errorf("an absent key: %v reads, fn saw exists=%v; want 0 reads, [false]", got, sawExisting)
	}
	stored, srev, found, err := bus.GetFresh[schema.Run](ctx, b.Runs, "1.0.1")
	if err != nil || !found || stored.Runner != 7 || stored.Turn != 1 || srev != rev {
		t.Fatalf("stored %+v rev %d (%v, %v), want runner 7 at rev %d", stored, srev, found, err, rev)
	}

	// The key is there: the guess's create is refused, and fn runs on the
	// value stored, which keeps its runner.
	sawExisting = nil
	r0 = reads()
	v, rev2, wrote, err := bus.MutateNew(ctx, b.Runs, "1.0.1", claim(9))
	if err != nil || !wrote || v.Runner != 7 || v.Turn != 2 || rev2 <= rev {
		t.Fatalf("a present key: %+v rev %d wrote %v err %v, want runner 7, turn 2", v, rev2, wrote, err)
	}
	if got := reads() - r0; got != 1 || fmt.Sprint(sawExisting) != "[false true]" {
		t.Errorf("a present key: %v reads, fn saw exists=%v; want 1 read, [false true]", got, sawExisting)
	}
	if got := conflicts() - c0; got != 0 {
		t.Errorf("a wrong guess counted as %v conflicts, want 0", got)
	}

	// A deleted key is absent again: created over its delete marker.
	if err := b.Runs.Delete(ctx, "1.0.1"); err != nil {
		t.Fatal(err)
	}
	sawExisting = nil
	if v, _, wrote, err := bus.MutateNew(ctx, b.Runs, "1.0.1", claim(11)); err != nil || !wrote || v.Runner != 11 || fmt.Sprint(sawExisting) != "[false]" {
		t.Fatalf("a deleted key: %+v wrote %v err %v, fn saw %v", v, wrote, err, sawExisting)
	}

	// fn writes nothing on the guess: the decision rests on a read.
	r0 = reads()
	nothing := func(r *schema.Run, exists bool) (bool, error) { return exists && r.Runner == 0, nil }
	if _, _, wrote, err := bus.MutateNew(ctx, b.Runs, "1.0.1", nothing); err != nil || wrote {
		t.Fatalf("no write: wrote %v err %v", wrote, err)
	}
	if got := reads() - r0; got != 1 {
		t.Errorf("a decision not to write rested on %v reads, want 1", got)
	}
}

// TestAReconnectLosesNoMessage: a consumer's pull request open when its
// connection drops and comes back may still be open on the server. The
// puller asked again for every slot after the reconnect, so the server
// held requests for twice its slots: the message beyond them was handed
// back at once, to the same request, again and again until its deliveries
// ran out, and nothing ever handled it.
func TestAReconnectLosesNoMessage(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	const slots = 4
	h := newHeld()
	hb := newHandledBy()
	hb.consume(t, b, "a", bus.Consumer{Stream: bus.StreamRollout, Durable: "reconnect", Filters: []string{"rollout.*.status"}, Concurrency: slots}, h.work)
	ctx := context.Background()
	cons, err := b.JS.Consumer(ctx, bus.StreamRollout, "reconnect")
	for err != nil {
		time.Sleep(10 * time.Millisecond)
		cons, err = b.JS.Consumer(ctx, bus.StreamRollout, "reconnect")
	}
	// The idle consumer's request is open on the server.
	eventuallyBus(t, "a pull request waiting", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting > 0
	})
	reconnected := make(chan struct{}, 1)
	b.NC.SetReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} })
	if err := b.NC.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	<-reconnected
	time.Sleep(200 * time.Millisecond) // the puller has heard of it, and asked again
	publishStatuses(t, b, 0, slots+1)
	eventuallyBus(t, "every slot busy", func() bool { return hb.count("a") == slots })
	time.Sleep(500 * time.Millisecond) // the message beyond the slots had time to bounce
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Consumer > slots+1 {
		t.Errorf("%d deliveries of %d messages while %d slots were busy: the one beyond them was handed back and delivered again", info.Delivered.Consumer, slots+1, slots)
	}
	close(h.release)
	settle(t, b, "reconnect", func() bool { return hb.count("a") == slots+1 })
	hb.mu.Lock()
	defer hb.mu.Unlock()
	for r, by := range hb.by {
		if len(by) != 1 {
			t.Errorf("message %d handled %d times", r, len(by))
		}
	}
	if most := h.takeMost(); most > slots {
		t.Errorf("%d handlers at once with %d slots", most, slots)
	}
}

// TestNotYetPastTheMostDeliveriesIsGivenUpAloud: "not yet" (fail.After)
// counts a delivery too. A message that says it past the consumer's most
// deliveries was dropped by JetStream in silence; it is given up (term)
// with a log and an advisory, as any other failure past the most.
func TestNotYetPastTheMostDeliveriesIsGivenUpAloud(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	terminated, err := b.NC.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>")
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(ctx, bus.Consumer{Stream: bus.StreamRollout, Durable: "later", Filters: []string{"rollout.*.status"}, MaxDeliver: 3},
			func(context.Context, bus.Msg) error {
				handled.Add(1)
				return fail.After(10*time.Millisecond, errors.New("not yet"))
			})
	}()
	defer func() { cancel(); <-done }()
	publishStatuses(t, b, 0, 1)
	if _, err := terminated.NextMsg(30 * time.Second); err != nil {
		t.Fatalf("no termination advisory after %d deliveries: %v", handled.Load(), err)
	}
	if n := handled.Load(); n != 3 {
		t.Errorf("handled %d times; want 3 (MaxDeliver)", n)
	}
}

// TestProvisioningAgainKeepsTheLongerHistory: planact provision run again
// with its defaults (or planact up on the same server) lowered the history
// and the storage set before, and JetStream removed at once every message
// past the new limits: sessions and results included. A re-run with the
// defaults keeps the larger limits it finds; one that states them, or
// Shrink, sets them.
func TestProvisioningAgainKeepsTheLongerHistory(t *testing.T) {
	_, url := bustest.Server(t)
	nc := bustest.Conn(t, url)
	ctx := context.Background()
	const long, short = 72 * time.Hour, 12 * time.Hour
	storage := int64(1 << 30)
	limits := func() (rollout, sessions, tasks time.Duration, bytes int64) {
		t.Helper()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{bus.StreamRollout, "KV_" + bus.BucketSession, "OBJ_" + bus.ObjectTasks(schema.RolePlanner)} {
			st, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			switch name {
			case bus.StreamRollout:
				rollout, bytes = info.Config.MaxAge, info.Config.MaxBytes
			case "KV_" + bus.BucketSession:
				sessions = info.Config.MaxAge
			default:
				tasks = info.Config.MaxAge
			}
		}
		return
	}
	if err := bus.Provision(ctx, nc, bustest.Logger(), bus.Provisioning{History: long, Storage: storage}); err != nil {
		t.Fatal(err)
	}
	_, _, _, before := limits()
	if err := bus.Provision(ctx, nc, bustest.Logger(), bus.Provisioning{}); err != nil {
		t.Fatal(err)
	}
	if r, s, o, _ := limits(); r != long || s != long || o != long {
		t.Errorf("provisioned again with the defaults: ROLLOUT %v, sessions %v, task store %v; want the %v set before kept", r, s, o, long)
	}
	if err := bus.Provision(ctx, nc, bustest.Logger(), bus.Provisioning{History: short, Storage: storage / 2}); err != nil {
		t.Fatal(err)
	}
	if r, s, o, bytes := limits(); r != short || s != short || o != short || bytes >= before {
		t.Errorf("provisioned with a shorter history and less storage: ROLLOUT %v (%d bytes, was %d), sessions %v, task store %v; want %v and less room", r, bytes, before, s, o, short)
	}
	if err := bus.Provision(ctx, nc, bustest.Logger(), bus.Provisioning{History: long}); err != nil {
		t.Fatal(err)
	}
	if err := bus.Provision(ctx, nc, bustest.Logger(), bus.Provisioning{Shrink: true}); err != nil {
		t.Fatal(err)
	}
	if r, _, _, _ := limits(); r != bus.DefaultProvisioning().History {
		t.Errorf("provisioned with the defaults and Shrink: ROLLOUT %v; want the default %v", r, bus.DefaultProvisioning().History)
	}
}

// held is handlers' work that holds each message until release is closed,
// counting the most held at once.
type held struct {
	mu            sync.Mutex
	running, most int
	release       chan struct{}
}

func newHeld() *held { return &held{release: make(chan struct{})} }

func (h *held) work(ctx context.Context) {
	h.mu.Lock()
	h.running++
	h.most = max(h.most, h.running)
	h.mu.Unlock()
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	h.mu.Lock()
	h.running--
	h.mu.Unlock()
}

// takeMost returns the most held at once so far, and counts from 0 anew.
func (h *held) takeMost() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.most
	h.most = 0
	return m
}
