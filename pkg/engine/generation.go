package engine

import (
	"context"
	"strconv"
)

// GenerationHeader names, on every request made for one generation (its
// tokenize and its generate), the generation it is for: a planner turn
// ("<rollout>-<episode>-t<turn>", see TurnGeneration) or an act
// ("<rollout>-<episode>-<node key>", see ActGeneration). An operator can
// count an engine's requests per turn and per act from its access log, and
// see that each is generated once.
const GenerationHeader = "X-Planact-Generation"

type generationKey struct{}

// WithGeneration returns a context whose engine requests name generation
// id in GenerationHeader.
func WithGeneration(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, generationKey{}, id)
}

// GenerationOf is the generation ctx's requests are for, or "".
func GenerationOf(ctx context.Context) string {
	id, _ := ctx.Value(generationKey{}).(string)
	return id
}

// TurnGeneration names planner turn t of episode e of rollout n.
func TurnGeneration(n int64, e, t int) string {
	return EpisodeKey(n, e) + "-t" + strconv.Itoa(t)
}

// ActGeneration names the act with node key key (e.g. "t1-s2") of episode e
// of rollout n.
func ActGeneration(n int64, e int, key string) string {
	return EpisodeKey(n, e) + "-" + key
}
