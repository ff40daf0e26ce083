package replay

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
)

// TestARecordingReadsWhereMessagesAreStored: each reads a stream with
// direct gets, whose answer is the stored message with its own headers,
// then the server's (subject, sequence, time). A message whose writer (a
// trainer's arrival holds what the trainer wrote) set headers of those
// names was read as it said: a Status ended the reading there, the rest
// of the rollout left out of the recording; a Nats-Sequence sent it back
// to read the same messages again, for ever; a Nats-Subject filed it
// under another subject.
func TestARecordingReadsWhereMessagesAreStored(t *testing.T) {
	_, url := bustest.Server(t)
	nc := bustest.Conn(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SPOOF", Subjects: []string{"spoof.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
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
	publish("spoof.back", "Nats-Sequence", "1", "Nats-Subject", "spoof.first", "Nats-Time-Stamp", "2000-01-01T00:00:00Z")
	publish("spoof.missing", "Status", "404", "Description", "Message Not Found")
	publish("spoof.failed", "Status", "408", "Description", "Request Timeout")
	publish("spoof.last")
	want := []string{"spoof.first", "spoof.back", "spoof.missing", "spoof.failed", "spoof.last"}
	var got []string
	err = each(ctx, nc, "SPOOF", "spoof.>", func(subj string, _ nats.Header, data []byte) error {
		if subj != string(data) {
			return fmt.Errorf("message %q read as on %s", data, subj)
		}
		if got = append(got, subj); len(got) > len(want) {
			return fmt.Errorf("read %v: more messages than the stream holds", got)
		}
		return nil
	})
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("read %v, %v; want %v", got, err, want)
	}
}
