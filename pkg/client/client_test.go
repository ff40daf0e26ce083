package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
)

func TestArrivalsPlanactCannotAnswerAreRefusedAtOnce(t *testing.T) {
	_, url := bustest.Server(t)
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, a := range []*schema.Arrive{
		{Rollout: 1, Role: "critic", Engine: schema.Engine{URL: "http://e"}},
		{Rollout: -1, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}},
		{Rollout: 1, Role: schema.RolePlanner},
	} {
		if err := c.Arrive(ctx, a); !errors.Is(err, client.ErrRejected) {
			t.Errorf("%+v: %v, want ErrRejected", a, err)
		}
	}
}

// TestResultTimesOut: with nobody to answer, waiting ends with ErrTimeout
// when the caller's context does, so a trainer can fall back.
func TestResultTimesOut(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Bus(t, url, "provision") // the streams exist, planact does not run
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res, err := c.Result(ctx, 9, schema.RoleActor)
	if !errors.Is(err, client.ErrTimeout) || res != nil {
		t.Errorf("%v %v, want ErrTimeout and no result", res, err)
	}
}
