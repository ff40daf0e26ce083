package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestCancelAndPauseRefuseALongReasonBeforeSending: a cancel's or a
// pause's reason over schema.MaxReason bytes, which planact refuses (it
// repeats the reason), is an error at once naming the reason, and nothing
// is sent; one of schema.MaxReason bytes is sent.
func TestCancelAndPauseRefuseALongReasonBeforeSending(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "provision") // the streams exist, planact does not run
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	const n = 12
	stream := bus.StreamTrainer(schema.RoleActor)
	cancelSubj, pauseSubj := subject.Cancel(n, schema.RoleActor), subject.Control(schema.RoleActor, "pause")
	sent := func(subj string) bool {
		t.Helper()
		m, err := b.LastMsg(t.Context(), stream, subj)
		if err != nil {
			t.Fatal(err)
		}
		return m != nil
	}
	// Nothing answers here: a call that sends waits until its ctx ends.
	bounded := func() context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	long := strings.Repeat("r", schema.MaxReason+1)
	err = c.Cancel(bounded(), n, schema.RoleActor, long)
	if err == nil || errors.Is(err, client.ErrTimeout) || !strings.Contains(err.Error(), fmt.Sprintf("reason of %d bytes", len(long))) {
		t.Errorf("a cancel with a reason of %d bytes: %v; want an error naming it", len(long), err)
	}
	if sent(cancelSubj) {
		t.Error("the cancel with too long a reason was sent")
	}
	_, err = c.Pause(bounded(), schema.RoleActor, client.PauseOptions{Reason: long})
	if err == nil || errors.Is(err, client.ErrTimeout) || !strings.Contains(err.Error(), fmt.Sprintf("reason of %d bytes", len(long))) {
		t.Errorf("a pause with a reason of %d bytes: %v; want an error naming it", len(long), err)
	}
	if sent(pauseSubj) {
		t.Error("the pause with too long a reason was sent")
	}
	_ = c.Cancel(bounded(), n, schema.RoleActor, long[1:])
	_, _ = c.Pause(bounded(), schema.RoleActor, client.PauseOptions{Reason: long[1:]})
	if !sent(cancelSubj) || !sent(pauseSubj) {
		t.Errorf("a reason of %d bytes: cancel sent %v, pause sent %v; want both", schema.MaxReason, sent(cancelSubj), sent(pauseSubj))
	}
}
