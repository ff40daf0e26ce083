package bus

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// TestAStoredMessageCannotSayWhereItIs: a direct get's answer is the
// stored message with its headers, then the server's: its subject,
// sequence and time. A message whose writer (a trainer, say) set headers
// of those names was read as it said: another subject, another sequence
// (a follower reading on from there skips or reads again), another time.
// One that set a Status was read as missing, or as the end of a batch.
func TestAStoredMessageCannotSayWhereItIs(t *testing.T) {
	_, nc := startEmbedded(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SPOOF", Subjects: []string{"spoof.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	publish := func(subj string, hdr ...string) {
		m := nats.NewMsg(subj)
		for i := 0; i+1 < len(hdr); i += 2 {
			m.Header.Set(hdr[i], hdr[i+1])
		}
		m.Data = []byte(subj)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish("spoof.first")
	publish("spoof.a", "Nats-Sequence", "1", "Nats-Subject", "spoof.first", "Nats-Time-Stamp", "2000-01-01T00:00:00Z")
	publish("spoof.missing", "Status", "404", "Description", "Message Not Found")
	publish("spoof.end", "Status", "204", "Nats-Num-Pending", "0")
	publish("spoof.last")
	want := map[string]uint64{"spoof.first": 1, "spoof.a": 2, "spoof.missing": 3, "spoof.end": 4, "spoof.last": 5}
	check := func(how string, m *StoredMsg) {
		t.Helper()
		if m == nil {
			t.Errorf("%s: no message", how)
			return
		}
		if string(m.Data) != m.Subject || m.Seq != want[m.Subject] || m.Time.Before(began.Add(-time.Minute)) {
			t.Errorf("%s: message %q read as %s sequence %d at %v; want %s sequence %d, stored now", how, m.Data, m.Subject, m.Seq, m.Time, m.Data, want[string(m.Data)])
		}
	}
	for subj := range want {
		m, err := getMsg(ctx, nc, "SPOOF", map[string]any{"last_by_subj": subj}, true)
		if err != nil {
			t.Errorf("direct get of %s: %v", subj, err)
			continue
		}
		check("direct get of "+subj, m)
	}
	b := &Bus{NC: nc, JS: js, Log: zerolog.Nop()}
	msgs, whole, err := b.directBatch(ctx, "SPOOF", map[string]any{"multi_last": []string{"spoof.>"}})
	if err != nil || !whole || len(msgs) != len(want) {
		t.Errorf("last of every subject: %d messages, whole %v, %v; want %d, whole", len(msgs), whole, err, len(want))
	}
	for _, m := range msgs {
		check("last of every subject", m)
	}
	batch, err := ReadBatch(ctx, nc, "SPOOF", "spoof.>", 1, 10)
	if err != nil || len(batch.Msgs) != len(want) || batch.Pending != 0 {
		t.Errorf("batch: %v, %v; want %d messages", batch, err, len(want))
	}
	for i := range batch.Msgs {
		check("batch", &batch.Msgs[i])
	}
}

// TestAMessageThatSaysItIsAStatusIsHandled: a message whose writer gave it
// a Status header and no body is a message, delivered with a reply
// subject to ack it on; a request's end has none. It was taken for an
// end: never handled nor acked, delivered again at every ack wait, and
// dropped in silence after the most deliveries.
func TestAMessageThatSaysItIsAStatusIsHandled(t *testing.T) {
	b, _ := provisionedBus(t)
	pulledStream(t, b, 0)
	m := nats.NewMsg("pulled.status")
	m.Header.Set("Status", "408")
	m.Header.Set("Nats-Pending-Messages", "1")
	if _, err := b.JS.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	handled := make(chan *nats.Msg, 1)
	release := make(chan struct{})
	close(release)
	p := pullerOn(t, b, "status", 1, handled, release)
	p.mu.Lock()
	err := p.listen()
	p.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	p.ask(1)
	select {
	case got := <-handled:
		if got.Subject != "pulled.status" {
			t.Errorf("handled %s, want pulled.status", got.Subject)
		}
	case <-time.After(10 * time.Second): // the ack wait is 30 s: nothing else delivers it
		t.Error("a message with a Status header and no body was not handled")
	}
	p.wg.Wait()
}
