package bus

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// A node's crash leaves the streams it led without a leader until
// JetStream elects one (4–9 s): a publish meanwhile gets no answer at all
// (no responders). It must wait for the new leader and land, not fail and
// leave its handler's work to a redelivery seconds later. Here the stream
// is missing for a while, which looks the same to the publisher.
func TestPublishWaitsForTheStreamsLeader(t *testing.T) {
	_, nc := startEmbedded(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b := &Bus{NC: nc, JS: js, Log: zerolog.Nop()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	created := make(chan error, 1)
	go func() {
		// The "election": the stream answers only after seconds, longer
		// than the client library's own retries of no responders.
		time.Sleep(2 * time.Second)
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ELECTED", Subjects: []string{"elected.>"}})
		created <- err
	}()
	msg := nats.NewMsg("elected.1")
	msg.Header.Set(jetstream.MsgIDHeader, "elected-1")
	msg.Data = []byte("outcome")
	ack, err := b.publishAck(ctx, msg)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("publish while the stream had no leader: %v", err)
	}
	if ack.Stream != "ELECTED" || ack.Sequence != 1 {
		t.Errorf("ack %+v, want ELECTED seq 1", ack)
	}

	// A stream that never answers still ends the publish, with the error
	// that says so, when the caller's context ends.
	short, cancelShort := context.WithTimeout(ctx, 5*leaderPoll)
	defer cancelShort()
	if _, err := b.publishAck(short, nats.NewMsg("nobody.1")); err == nil {
		t.Error("a publish no stream takes succeeded")
	}
}

// A leader read sent to a leader that just died is lost (no answer ever
// comes), and one sent during the election gets no responders: the read
// must ask again until the new leader answers, within its time-out.
func TestLeaderReadAsksAgainUntilTheLeaderAnswers(t *testing.T) {
	// A server without JetStream: the API subject is answered only by the
	// fake leader below.
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	leader, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var asked atomic.Int32
	ready := make(chan struct{})
	go func() {
		defer close(ready)
		time.Sleep(3 * leaderPoll) // no responders meanwhile
		_, err := leader.Subscribe("$JS.API.STREAM.MSG.GET.ELECTED", func(m *nats.Msg) {
			if asked.Add(1) == 1 {
				return // the old leader: the request is lost with it
			}
			reply, _ := json.Marshal(map[string]any{"message": map[string]any{"subject": "elected.1", "seq": 7, "data": []byte("state"), "time": time.Now()}})
			_ = m.Respond(reply)
		})
		if err != nil {
			t.Error(err)
		}
		_ = leader.Flush()
	}()
	m, err := getMsg(ctx, nc, "ELECTED", map[string]any{"last_by_subj": "elected.1"}, false)
	<-ready
	if err != nil {
		t.Fatalf("leader read across an election: %v", err)
	}
	if m == nil || m.Seq != 7 || string(m.Data) != "state" {
		t.Fatalf("read %+v, want seq 7 %q", m, "state")
	}
	if n := asked.Load(); n < 2 {
		t.Errorf("the leader was asked %d times, want the lost request asked again", n)
	}
}

// After requests refused in a row (no consumer leader during an election)
// a puller asks again at most maxPullRetry later.
func TestPullRetryIsBounded(t *testing.T) {
	prev := time.Duration(0)
	for n := 1; n <= 20; n++ {
		d := pullRetry(n)
		if d < prev || d > maxPullRetry || d <= 0 {
			t.Fatalf("retry after %d refusals: %s (after %d: %s), want growing up to %s", n, d, n-1, prev, maxPullRetry)
		}
		prev = d
	}
}
