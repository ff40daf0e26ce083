package session

import (
	"context"
	"errors"
	"fmt"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// StaleError refuses a generation whose engine serves weights further
// behind the role's newest version than max_staleness allows.
type StaleError struct{ Why string }

func (e *StaleError) Error() string { return e.Why }

// VersionAsker is what Check asks: an engine.Lease, whose answers are
// never older than the question.
type VersionAsker interface {
	WeightVersion(ctx context.Context) (string, error)
}

// Newest returns what reads role's newest weight version (the trainer's,
// which staleness is counted from) from the sessions bucket's leader: a
// decision to refuse a generation rests on a fresh read, not on a watch
// that may lag a resume or an arrival.
func Newest(b *bus.Bus, role string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		st, _, _, err := bus.GetFresh[schema.RoleState](ctx, b.Sessions, schema.RoleKey(role))
		if err != nil {
			return "", fmt.Errorf("read the %s role's newest weight version: %w", role, err)
		}
		return st.WeightVersion, nil
	}
}

// Check bounds staleness right before a generation: it reads the role's
// newest version (newest), asks the engine which weights it serves now,
// and refuses (a permanent *StaleError) those more than max versions
// behind (max 0: no bound, nothing read or asked). Versions are compared
// by the numbers they end in. When the engine cannot say (its protocol or
// server has no GET /get_weight_version), names no version, or a version
// ends in no number, the generation goes on and unchecked says why, for
// its result to say so. A read or an engine that does not answer fails
// the generation as their other errors do (tried again when transient).
func Check(ctx context.Context, eng VersionAsker, newest func(context.Context) (string, error), max int) (unchecked string, err error) {
	if max <= 0 {
		return "", nil
	}
	trainer, err := newest(ctx)
	if err != nil {
		return "", err
	}
	return check(ctx, eng, trainer, max)
}

func check(ctx context.Context, eng VersionAsker, newest string, max int) (unchecked string, err error) {
	if newest == "" {
		return "the role's trainer announced no weight version", nil
	}
	v, err := eng.WeightVersion(ctx)
	switch {
	case errors.Is(err, engine.ErrNotSupported):
		return "the engine cannot say which weights it serves: " + err.Error(), nil
	case err != nil:
		return "", fmt.Errorf("max_staleness %d: ask the engine which weights it serves: %w", max, err)
	case v == "":
		return "the engine names no weight version", nil
	}
	behind, ok := schema.Behind(newest, v)
	switch {
	case !ok:
		return fmt.Sprintf("the engine serves weights %q and the trainer's newest are %q: staleness is counted in the numbers versions end in", v, newest), nil
	case behind > int64(max):
		return "", fail.E(fail.Permanent, &StaleError{Why: fmt.Sprintf("the engine serves weights %s, %d versions behind the trainer's %s (max_staleness %d); "+
			"a trainer that went back to an earlier checkpoint says so with Resume(version)", v, behind, newest, max)})
	}
	return "", nil
}
