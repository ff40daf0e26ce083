package bus_test

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// A message published with the body its caller encoded is the message
// NewMsg makes of it: the same subject, headers and body.
func TestEncodedIsTheSameMessage(t *testing.T) {
	ctx := context.Background()
	m := &schema.Result{Rollout: 7, Role: schema.RoleActor, Status: schema.ResultOK,
		Samples: []schema.Sample{{RolloutID: "7-0", Tokens: []int{1, 2, 3}, LossMask: []int{0, 1, 1}, RolloutLogProbs: []float64{0, -0.5, -1}}}}
	want, err := bus.NewMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	body, err := schema.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := bus.NewMsg(ctx, bus.Encoded{Message: m, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if got.Subject != want.Subject || !bytes.Equal(got.Data, want.Data) {
		t.Fatalf("encoded: %s %d bytes; NewMsg: %s %d bytes", got.Subject, len(got.Data), want.Subject, len(want.Data))
	}
	if !maps.EqualFunc(got.Header, want.Header, slices.Equal) {
		t.Fatalf("headers: %v; NewMsg: %v", got.Header, want.Header)
	}
	// The body is sent as given, not encoded again.
	got, err = bus.NewMsg(ctx, bus.Encoded{Message: m, Body: []byte("given")})
	if err != nil || string(got.Data) != "given" {
		t.Fatalf("body %q, %v", got.Data, err)
	}
}
