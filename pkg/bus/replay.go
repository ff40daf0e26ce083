package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/fail"
)

// LastPerSubject calls fn with the last message of every subject that
// matches filter in stream, in stream order. It reads what the stream holds
// now and returns; it does not wait for new messages.
func (b *Bus) LastPerSubject(ctx context.Context, stream, filter string, fn func(subject string, data []byte) error) error {
	cons, err := b.JS.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		// Gone soon after the replay, not after nats.go's default 5 minutes.
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return fail.Transientf("replay %s %s: %w", stream, filter, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fail.Transientf("replay %s %s: %w", stream, filter, err)
	}
	pending := info.NumPending
	for pending > 0 {
		batch, err := cons.Fetch(min(int(pending), 512), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fail.Transientf("replay %s %s: %w", stream, filter, err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			if err := fn(msg.Subject(), msg.Data()); err != nil {
				return err
			}
			md, err := msg.Metadata()
			if err != nil {
				return fail.Transientf("replay %s: %w", filter, err)
			}
			pending = md.NumPending
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return fail.Transientf("replay %s %s: %w", stream, filter, err)
		}
		if got == 0 {
			return fail.Transientf("replay %s %s: %d messages pending but none delivered", stream, filter, pending)
		}
	}
	return nil
}

// LastMsg returns the last message on subject in stream; found is false if none.
func (b *Bus) LastMsg(ctx context.Context, stream, subject string) (data []byte, found bool, err error) {
	st, err := b.JS.Stream(ctx, stream)
	if err != nil {
		return nil, false, fail.Transientf("stream %s: %w", stream, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fail.Transientf("last message on %s: %w", subject, err)
	}
	return m.Data, true, nil
}
