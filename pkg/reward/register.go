package reward

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sync"
)

// Func scores a final answer: the task's prompt, the episode's answer and
// the task's label in, a reward out. An error costs the episode its reward
// (0, and the sample's metadata says why), not the rollout its samples.
type Func func(ctx context.Context, prompt, answer, label string) (float64, error)

var (
	regMu   sync.RWMutex
	funcs   = map[string]Func{}
	regName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)
)

// Register makes fn the reward function name, which a rollout's config
// names in reward. It panics on a built-in name (f1, em), a name that is
// not 1 to 64 lower-case letters, digits, '_' or '-' starting with a
// letter, a nil fn, or a name registered twice: mistakes of a main, found
// when it starts.
func Register(name string, fn Func) {
	switch {
	case name == "f1" || name == "em":
		panic(fmt.Sprintf("reward: Register(%q): a built-in reward", name))
	case !regName.MatchString(name):
		panic(fmt.Sprintf("reward: Register(%q): want 1 to 64 lower-case letters, digits, '_' or '-', from a letter", name))
	case fn == nil:
		panic(fmt.Sprintf("reward: Register(%q): nil Func", name))
	}
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := funcs[name]; dup {
		panic(fmt.Sprintf("reward: Register(%q) twice", name))
	}
	funcs[name] = fn
}

// Lookup returns the reward function name, if this process registered it.
func Lookup(name string) (Func, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	fn, ok := funcs[name]
	return fn, ok
}

// Registered lists the reward functions this process registered, sorted.
func Registered() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	var out []string
	for n := range funcs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
