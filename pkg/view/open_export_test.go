package view

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
)

// OpenPatient is Open whose requests each wait patience for an answer;
// unanswered is told of each one asked again.
func OpenPatient(ctx context.Context, nc *nats.Conn, patience time.Duration, unanswered func(error)) (*Reader, error) {
	return OpenWith(ctx, nc, Options{patience: patience, unanswered: unanswered})
}
