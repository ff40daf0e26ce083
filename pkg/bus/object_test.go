package bus_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestReadObjectOfAStoreThatIsGone: ReadObject says, as its doc does, that
// an object of a store that is gone is jetstream.ErrObjectNotFound, as a
// missing object is. It said "stream not found", a transient read error,
// which the readers that tell a missing object from a failed read (a task
// list gone is permanent, a result gone is reported) took for a read to
// try again.
func TestReadObjectOfAStoreThatIsGone(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	bucket := bus.ObjectResults(schema.RolePlanner)
	if _, err := b.Results[schema.RolePlanner].PutBytes(ctx, "samples", []byte("some samples")); err != nil {
		t.Fatal(err)
	}
	if err := b.JS.DeleteStream(ctx, "OBJ_"+bucket); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.ReadObject(ctx, b.NC, bucket, "samples", 0); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("object of a store that is gone: %v, want %v", err, jetstream.ErrObjectNotFound)
	}
}
