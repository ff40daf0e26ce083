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

// SetRoleState is what the follower does when the role's key changes.
func (g *Gate) SetRoleState(st schema.RoleState) { g.set(st) }
