package session

import (
	"context"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// LagDirectReads makes every direct read of a session answer as a follower
// that has not seen the rollout start (state waiting) until undo is called.
func LagDirectReads() (undo func()) {
	was := readSession
	readSession = func(ctx context.Context, kv *bus.Bucket, key string) (schema.Session, uint64, bool, error) {
		s, rev, found, err := was(ctx, kv, key)
		if found {
			s.State = schema.SessionWaiting
		}
		return s, rev, found, err
	}
	return func() { readSession = was }
}

// NewGate returns a gate that no follower feeds: SetState does.
func NewGate(role string) *Gate { return newGate(role) }

// SetState gives the gate a role state, as the follower does from the bucket.
func (g *Gate) SetState(st schema.RoleState) { g.set(st, 0) }

// SetStateAt gives the gate a role state read at bucket revision rev.
func (g *Gate) SetStateAt(st schema.RoleState, rev uint64) { g.set(st, rev) }
