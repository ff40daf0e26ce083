package bus_test

import (
	"context"
	"errors"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestMutateThatFailsReturnsNothing: fn's error aborts the write, and what
// fn made of the value before it failed is neither seen nor written; it
// was returned as if it were the value.
func TestMutateThatFailsReturnsNothing(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	held, rev, _, err := bus.MutateRev(ctx, b.Sessions, "failing", func(v *schema.Session, _ bool) (bool, error) {
		v.Episodes = 1
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused")
	half := func(v *schema.Session, _ bool) (bool, error) {
		v.Episodes = 99
		return true, refused
	}
	v, gotRev, wrote, err := bus.MutateRev(ctx, b.Sessions, "failing", half)
	if !errors.Is(err, refused) || wrote || v.Episodes != 0 || gotRev != 0 {
		t.Errorf("MutateRev: %d episodes, revision %d, wrote %v, %v; want the zero value, 0, false and fn's error", v.Episodes, gotRev, wrote, err)
	}
	v, gotRev, wrote, err = bus.MutateFrom(ctx, b.Sessions, "failing", held, rev, half)
	if !errors.Is(err, refused) || wrote || v.Episodes != 0 || gotRev != 0 {
		t.Errorf("MutateFrom: %d episodes, revision %d, wrote %v, %v; want the zero value, 0, false and fn's error", v.Episodes, gotRev, wrote, err)
	}
	if stored, _, _, err := bus.Get[schema.Session](ctx, b.Sessions, "failing"); err != nil || stored.Episodes != 1 {
		t.Errorf("stored %d episodes (%v), want 1", stored.Episodes, err)
	}
}
