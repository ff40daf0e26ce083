package bus

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A compare-and-set refused because another writer came first is a
// conflict, read again and retried, whatever code the stream gave it: a
// replicated stream refuses a write on a key with one in flight with
// 10164, not 10071, and nats.go's Create over a deleted key hands that
// error on as it is, matching neither ErrKeyExists nor
// ErrKeyRevisionMismatch. Taken for a failure, the Mutate failed its
// caller's work instead of retrying.
func TestEveryWrongLastSequenceIsAConflict(t *testing.T) {
	for _, tc := range []struct {
		err      error
		conflict bool
	}{
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence, Description: "wrong last sequence: 7"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant, Description: "wrong last sequence"}, true},
		{fmt.Errorf("create: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}), true},
		{fmt.Errorf("%w: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}, jetstream.ErrKeyRevisionMismatch), true},
		{jetstream.ErrKeyExists, true},
		{&jetstream.APIError{Code: 503, ErrorCode: jetstream.JSErrCodeStreamNotFound}, false},
		{jetstream.ErrNoStreamResponse, false},
		{nil, false},
	} {
		if got := isConflict(tc.err); got != tc.conflict {
			t.Errorf("%v: conflict %v, want %v", tc.err, got, tc.conflict)
		}
	}
}
