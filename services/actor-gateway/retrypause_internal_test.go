package actorgateway

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// A retry whose write keeps being refused, because the read of the act's
// last message stays behind (a lagging replica), is tried again after a
// pause that grows, until ctx ends: not as fast as NATS answers. It was
// tried again at once, thousands of times a second.
func TestARefusedRetryRecordPausesBeforeTryingAgain(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	filter := subject.ActOf(1, 0, "t1-s1")
	// Another gateway's record of the act's retries is on the stream.
	other := &schema.ActRetries{Rollout: 1, Key: "t1-s1", Turn: 1, Gateway: "other", Try: 1,
		Retries: []schema.Retry{{By: "replica-B", Why: "no actor-gateway acknowledged the request for 3s"}}}
	if stored, _, err := b.PublishAfter(context.Background(), other, filter, 0); err != nil || !stored {
		t.Fatalf("the other gateway's record: stored %v, %v", stored, err)
	}

	var attempts atomic.Int32
	real := publishRetries
	publishRetries = func(ctx context.Context, pb *bus.Bus, rec *schema.ActRetries, filter string, _ uint64) (bool, error) {
		attempts.Add(1)
		return real(ctx, pb, rec, filter, 0) // as a read that does not see the record yet: refused
	}
	defer func() { publishRetries = real }()

	g := &gateway{Deps: Deps{Bus: b, Log: bustest.Logger()}, id: "gw"}
	h, _ := json.Marshal(schema.Retry{By: "replica-A", Why: "no actor-gateway acknowledged the request for 3s", AtMs: 2})
	m := &nats.Msg{Header: nats.Header{}}
	m.Header.Set(schema.HdrActorRetry, string(h))
	req := &schema.ActorRequest{Rollout: 1, Key: "t1-s1", Try: 2}

	const window = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	began := time.Now()
	answer, _ := g.recordRetry(ctx, m, req, nil)
	took := time.Since(began)

	if answer == nil || answer.Header.Get(micro.ErrorCodeHeader) != CodeUnavailable {
		t.Fatalf("answer %v, want %s: not recorded before ctx ended", answer, CodeUnavailable)
	}
	// At most one attempt, and one more after each pause that fits in the
	// time it took: a timer never fires early, however loaded the machine.
	most, waited := 1, time.Duration(0)
	for {
		waited += retryPause(most)
		if waited > took {
			break
		}
		most++
	}
	if n := int(attempts.Load()); n == 0 || n > most {
		t.Errorf("%d attempts to record the retry in %v, want 1 to %d (a pause before each again)", n, took, most)
	}
}
