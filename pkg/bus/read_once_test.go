package bus_test

import (
	"context"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
)

// TestLastMsgsOnceRefusesAFilterForASubject: LastMsgsOnce reads the message
// of each subject it is given. A wildcard among them matched the filter and
// came back keyed by itself, holding whichever of the subjects it matches
// was written last: an answer for a subject no message is stored on.
func TestLastMsgsOnceRefusesAFilterForASubject(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	for _, subj := range []string{"act.1.done.1.a", "act.1.done.1.b"} {
		if _, err := b.JS.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	for _, subj := range []string{"act.1.done.1.*", "act.1.done.>"} {
		got, err := b.LastMsgsOnce(ctx, bus.StreamAct, "act.1.done.>", []string{"act.1.done.1.a", subj})
		if err == nil {
			t.Errorf("%s read as a subject: %d messages, no error", subj, len(got))
		}
	}
}
