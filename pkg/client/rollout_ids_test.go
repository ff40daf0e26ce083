package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
)

// TestRolloutIdsPlanactNeverRunsAreRefusedAtOnce: rollout ids start at 0.
// Waiting for the result or the groups of rollout -1 waited until the
// caller's context ended and then said ErrTimeout, as if planact were
// slow; a cancel of it was stored and then waited a minute for an answer
// that never comes ("is its session-store running?"). Each is refused at
// once, naming the id, as an arrival of it is.
func TestRolloutIdsPlanactNeverRunsAreRefusedAtOnce(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Bus(t, url, "provision")
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	// Bounds the test on the old code, which waited for it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const want = "rollout -1: must not be negative"
	if _, err := c.Result(ctx, -1, schema.RolePlanner); !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), want) {
		t.Errorf("result: %v, want ErrRejected naming %q", err, want)
	}
	for _, err := range c.Groups(ctx, -1, schema.RoleActor) {
		if !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), want) {
			t.Errorf("groups: %v, want ErrRejected naming %q", err, want)
		}
		break
	}
	if err := c.Cancel(ctx, -1, schema.RolePlanner, "enough"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("cancel: %v, want an error naming %q", err, want)
	}
	if err := c.Arrive(ctx, &schema.Arrive{Rollout: -1, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}}); !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), want) {
		t.Errorf("arrive: %v, want ErrRejected naming %q", err, want)
	}
}
