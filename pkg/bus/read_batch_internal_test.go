package bus

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// requests counts the reads of a stream: direct gets (any replica answers)
// and requests to its leader. Its subscriptions are synchronous: a message
// the server sent is counted once the connection read it, which a flush
// orders (an asynchronous handler may run later).
type requests struct{ direct, leader *nats.Subscription }

func countRequests(t *testing.T, nc *nats.Conn, stream string) *requests {
	t.Helper()
	r := &requests{}
	var err error
	if r.direct, err = nc.SubscribeSync("$JS.API.DIRECT.GET." + stream); err != nil {
		t.Fatal(err)
	}
	if r.leader, err = nc.SubscribeSync("$JS.API.STREAM.MSG.GET." + stream); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

// settled counts the requests since it was last called, once every request
// sent before it has reached the counting connection: the reader's flush
// has the server take them (and route them to the counter), the counter's
// has its connection read them.
func (r *requests) settled(t *testing.T, reader, counter *nats.Conn) (direct, leader int64) {
	t.Helper()
	if err := reader.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := counter.Flush(); err != nil {
		t.Fatal(err)
	}
	take := func(sub *nats.Subscription) int64 {
		n, _, err := sub.Pending()
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			if _, err := sub.NextMsg(time.Second); err != nil {
				t.Fatal(err)
			}
		}
		return int64(n)
	}
	return take(r.direct), take(r.leader)
}

// provisionedBus is a Bus on a provisioned embedded server, and a second
// connection to that server.
func provisionedBus(t *testing.T) (*Bus, *nats.Conn) {
	t.Helper()
	url, nc := startEmbedded(t)
	if err := Provision(context.Background(), nc, zerolog.Nop(), Provisioning{}); err != nil {
		t.Fatal(err)
	}
	b, err := Connect(context.Background(), ConnOptions{URL: url}, "test", zerolog.Nop(), Provisioning{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, nc
}

func publishActs(ctx context.Context, t *testing.T, b *Bus, n int64, e int, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if stored, err := b.PublishOnce(ctx, &schema.ActDone{Rollout: n, Episode: e, Turn: 1, Key: k, Status: schema.ActDoneOK, Output: "out " + k}); err != nil || !stored {
			t.Fatalf("act %s: stored %v, %v", k, stored, err)
		}
	}
}

// An episode's act outcomes are read in one request, not one each; on a
// stream with replicas, where a follower may answer that request a moment
// behind, a subject it lacks is read again from the leader.
func TestLastMsgsOnceReadsAnEpisodeInOneRequest(t *testing.T) {
	b, nc := provisionedBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := []string{"t1-a", "t1-b", "t1-c", "t2-a", "t2-d"}
	publishActs(ctx, t, b, 4, 2, keys...)
	publishActs(ctx, t, b, 4, 3, "t1-a") // another episode: not in the answer
	publishActs(ctx, t, b, 4, 2, "t3-x") // this episode's, not asked for
	var subjects []string
	for _, k := range keys {
		subjects = append(subjects, subject.ActDone(4, 2, k))
	}
	absent := subject.ActDone(4, 2, "t9-none")
	subjects = append(subjects, absent)
	reqs := countRequests(t, nc, StreamAct)

	check := func(got map[string]*StoredMsg) {
		t.Helper()
		if len(got) != len(keys) {
			t.Fatalf("got %d messages, want %d: %v", len(got), len(keys), got)
		}
		for i, k := range keys {
			m := got[subjects[i]]
			var d schema.ActDone
			if m == nil || schema.Unmarshal(m.Data, &d) != nil || d.Key != k || d.Episode != 2 || d.Output != "out "+k {
				t.Fatalf("%s: %+v (%+v)", subjects[i], m, d)
			}
			one, err := b.LastMsg(ctx, StreamAct, subjects[i])
			if err != nil || one.Seq != m.Seq || !one.Time.Equal(m.Time) || m.Header.Get(schema.HdrSchema) != one.Header.Get(schema.HdrSchema) {
				t.Fatalf("%s: batch read seq %d at %v (%v), alone seq %d at %v (%v), %v", subjects[i], m.Seq, m.Time, m.Header, one.Seq, one.Time, one.Header, err)
			}
		}
	}

	got, err := b.LastMsgsOnce(ctx, StreamAct, subject.ActDones(4, 2), subjects)
	if err != nil {
		t.Fatal(err)
	}
	if direct, leader := reqs.settled(t, b.NC, nc); direct != 1 || leader != 0 {
		t.Errorf("one server: %d direct gets and %d leader reads, want 1 and 0", direct, leader)
	}
	check(got)
	reqs.settled(t, b.NC, nc) // check's own reads

	// As on a cluster: the absent subject is read again, from the leader.
	b.single[StreamAct] = false
	got, err = b.LastMsgsOnce(ctx, StreamAct, subject.ActDones(4, 2), subjects)
	if err != nil {
		t.Fatal(err)
	}
	if direct, leader := reqs.settled(t, b.NC, nc); direct != 1 || leader != 1 {
		t.Errorf("replicas: %d direct gets and %d leader reads, want 1 and 1 (the absent subject)", direct, leader)
	}
	check(got)
	b.single[StreamAct] = true

	// Nothing stored under the filter at all.
	got, err = b.LastMsgsOnce(ctx, StreamAct, subject.ActDones(4, 7), []string{subject.ActDone(4, 7, "t1-a")})
	if err != nil || len(got) != 0 {
		t.Errorf("an episode with no outcome: %v, %v", got, err)
	}
	if got, err := b.LastMsgsOnce(ctx, StreamAct, subject.ActDones(4, 2), nil); err != nil || len(got) != 0 {
		t.Errorf("no subjects: %v, %v", got, err)
	}
	reqs.settled(t, b.NC, nc)
	_, err = b.LastMsgsOnce(ctx, StreamAct, subject.ActDones(4, 2), []string{subjects[0], subject.ActDone(4, 3, "t1-a")})
	if err == nil || !strings.Contains(err.Error(), "act.4.done.3.t1-a does not match the filter act.4.done.2.*") {
		t.Errorf("a subject outside the filter: %v, want an error naming both", err)
	}
	if direct, leader := reqs.settled(t, b.NC, nc); direct+leader != 0 {
		t.Errorf("a refused read sent %d requests", direct+leader)
	}
}

// More subjects than one answer holds (the server's 1,024): the server
// says so, and every subject is read on its own.
func TestLastMsgsOnceBeyondOneAnswer(t *testing.T) {
	b, nc := provisionedBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var keys, subjects []string
	for i := range 1030 {
		keys = append(keys, fmt.Sprintf("t1-n%d", i))
		subjects = append(subjects, subject.ActDone(6, 0, keys[i]))
	}
	publishActs(ctx, t, b, 6, 0, keys...)
	reqs := countRequests(t, nc, StreamAct)
	got, err := b.LastMsgsOnce(ctx, StreamAct, subject.ActDones(6, 0), subjects)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(keys) {
		t.Fatalf("got %d messages, want %d", len(got), len(keys))
	}
	for i, k := range keys {
		var d schema.ActDone
		if m := got[subjects[i]]; m == nil || schema.Unmarshal(m.Data, &d) != nil || d.Key != k {
			t.Fatalf("%s: %+v", subjects[i], m)
		}
	}
	if direct, _ := reqs.settled(t, b.NC, nc); direct != 1+int64(len(keys)) {
		t.Errorf("%d direct gets, want the batch and one per subject (%d)", direct, 1+len(keys))
	}
}

// Batch reads share one subscription of the connection: reads at once
// each get their own answer, whole.
func TestLastMsgsOnceAtOnce(t *testing.T) {
	b, _ := provisionedBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const episodes, acts = 8, 12
	for e := range episodes {
		var keys []string
		for k := range acts - e {
			keys = append(keys, fmt.Sprintf("t1-n%d", k))
		}
		publishActs(ctx, t, b, 9, e, keys...)
	}
	errs := make(chan error, episodes*5)
	for e := range episodes {
		for range 5 {
			go func() {
				var subjects []string
				for k := range acts {
					subjects = append(subjects, subject.ActDone(9, e, fmt.Sprintf("t1-n%d", k)))
				}
				got, err := b.LastMsgsOnce(ctx, StreamAct, subject.ActDones(9, e), subjects)
				if err == nil && len(got) != acts-e {
					err = fmt.Errorf("episode %d: %d messages, want %d", e, len(got), acts-e)
				}
				for subj, m := range got {
					var d schema.ActDone
					if err == nil && (subj != m.Subject || schema.Unmarshal(m.Data, &d) != nil || d.Episode != e) {
						err = fmt.Errorf("episode %d: %s holds %s (episode %d)", e, subj, m.Subject, d.Episode)
					}
				}
				errs <- err
			}()
		}
	}
	for range episodes * 5 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestFollowCaughtUpOnlyWhenTheBatchEnded: a batch whose end (the 204 that
// says how many are left) did not come within the read's time-out is kept,
// and used to count as caught up: the web view and `planact watch` drew
// their board as whole while the stream held more. caughtUp now waits for
// a read the replica ended. A stand-in replica answers the first read
// with one message and no end, and every later one with nothing more.
func TestFollowCaughtUpOnlyWhenTheBatchEnded(t *testing.T) {
	_, nc := startEmbedded(t)
	defer func(d time.Duration) { batchTimeout = d }(batchTimeout)
	batchTimeout = 50 * time.Millisecond
	var reads atomic.Int64
	sub, err := nc.Subscribe("$JS.API.DIRECT.GET.FAKE", func(m *nats.Msg) {
		reply := nats.NewMsg(m.Reply)
		if reads.Add(1) == 1 {
			reply.Header.Set("Nats-Subject", "fake.1")
			reply.Header.Set("Nats-Sequence", "1")
			reply.Header.Set("Nats-Time-Stamp", time.Now().UTC().Format(time.RFC3339Nano))
			reply.Data = []byte("one")
		} else {
			reply.Header.Set("Status", "404")
		}
		_ = m.RespondMsg(reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	caught := make(chan int64, 1)
	go func() {
		_ = Follow(ctx, nc, "FAKE", "fake.>", 1, 10*time.Millisecond, func(StoredMsg) {}, func() {
			select {
			case caught <- reads.Load():
			default:
			}
		})
	}()
	select {
	case n := <-caught:
		if n < 2 {
			t.Errorf("caught up after %d read, whose end of batch never came; want after a read that ended", n)
		}
	case <-ctx.Done():
		t.Fatal("never caught up")
	}
	cancel()
}
