package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestAStoredStatusIsAMessage: the client reads the last message on a
// subject with a direct get, whose answer is the stored message with its
// own headers, then the server's. A message with no body whose writer set
// a Status header was taken for the server's "nothing there": Result
// waited for a result already out until its time ran out, instead of
// saying that the message there does not read.
func TestAStoredStatusIsAMessage(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	const n = 31
	m := nats.NewMsg(subject.Result(n, schema.RoleActor))
	m.Header.Set("Status", "404")
	m.Header.Set("Description", "Message Not Found")
	if _, err := b.JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	// Bounds the wait of the old reading, which never ends otherwise.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := c.Result(rctx, n, schema.RoleActor)
	if err == nil || errors.Is(err, client.ErrTimeout) || !strings.Contains(err.Error(), m.Subject) {
		t.Errorf("result %+v, %v; want an error naming %s, whose message does not read", res, err, m.Subject)
	}
}
