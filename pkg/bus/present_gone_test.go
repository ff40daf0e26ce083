package bus_test

import (
	"context"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
)

// TestGoneTwiceSaysItOnce: a gateway that says it stopped a second time
// (two paths to its shutdown) is not stopped by a panic; it closed its
// renewals twice.
func TestGoneTwiceSaysItOnce(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gone, err := b.Present(ctx, schema.RolePlanner, "g1")
	if err != nil {
		t.Fatal(err)
	}
	gone()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("gone called twice: panic %v", r)
		}
	}()
	gone()
	ids, err := b.PresentGateways(ctx, schema.RolePlanner)
	if err != nil || len(ids) != 0 {
		t.Errorf("present after gone: %v, %v; want none", ids, err)
	}
}
