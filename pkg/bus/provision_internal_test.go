package bus

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// unanswered is a JetStream whose first look at each stream, bucket and
// object store is not answered (a leader being elected, a loaded server):
// what provisioning finds is then unknown, not missing.
type unanswered struct {
	jetstream.JetStream
	mu     sync.Mutex
	looked map[string]bool
}

func (u *unanswered) first(name string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.looked[name] {
		return false
	}
	u.looked[name] = true
	return true
}

func (u *unanswered) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if u.first("stream " + name) {
		return nil, context.DeadlineExceeded
	}
	return u.JetStream.Stream(ctx, name)
}

func (u *unanswered) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	if u.first("kv " + bucket) {
		return nil, context.DeadlineExceeded
	}
	return u.JetStream.KeyValue(ctx, bucket)
}

func (u *unanswered) ObjectStore(ctx context.Context, bucket string) (jetstream.ObjectStore, error) {
	if u.first("object store " + bucket) {
		return nil, context.DeadlineExceeded
	}
	return u.JetStream.ObjectStore(ctx, bucket)
}

// TestProvisioningKeepsWhatItCouldNotRead: provisioning that could not
// read a stream (or bucket, or object store) took it for missing and
// "created" it with the settings asked for, as they were: an update that
// lowered the history set before (JetStream removing at once every message
// past it), the storage, and on a cluster the replicas, which a re-run with
// the defaults must never do. What cannot be read now is read again.
func TestProvisioningKeepsWhatItCouldNotRead(t *testing.T) {
	_, nc := startEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const long = 72 * time.Hour
	if err := Provision(ctx, nc, zerolog.Nop(), Provisioning{History: long}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	p := Provisioning{}.WithDefaults()
	b := &Bus{NC: nc, JS: &unanswered{JetStream: js, looked: map[string]bool{}}, Log: zerolog.Nop(), Provisioning: p}
	// Each try stops at what it could not read; the next reads it.
	for try := 0; ; try++ {
		err := b.provisionOnce(ctx, p)
		if err == nil {
			break
		}
		if !errors.Is(err, context.DeadlineExceeded) || try > 20 {
			t.Fatalf("try %d: %v", try, err)
		}
	}
	var names []string
	for _, c := range p.StreamConfigs() {
		names = append(names, c.Name)
	}
	for _, c := range p.KeyValueConfigs() {
		names = append(names, "KV_"+c.Bucket)
	}
	for _, c := range p.ObjectStoreConfigs() {
		names = append(names, "OBJ_"+c.Bucket)
	}
	for _, name := range names {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.MaxAge; got != long && !(name == StreamPresence && got == PresenceLease) {
			t.Errorf("%s keeps %v of history, want the %v set before", name, got, long)
		}
	}
}
