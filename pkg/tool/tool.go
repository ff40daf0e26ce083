// Package tool is the registry of tools written in Go: a program of your
// own registers a tool in its main (before it serves), and a rollout whose
// config declares it with kind "go" has the act-dispatcher call it in
// process, with the act's retries, time-out and outcome like any other
// tool's. Tools served over HTTP need no registration (kind "http").
package tool

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sync"
)

// Func runs one act: the node's input (placeholders filled) in, its output
// out. An error fails the attempt; one that wraps a pkg/fail kind decides
// whether the act is retried (fail.Transient) or not (fail.Permanent,
// fail.Invalid); a plain error is retried. ctx ends at the act's time-out.
type Func func(ctx context.Context, input string) (string, error)

var (
	mu    sync.RWMutex
	funcs = map[string]Func{}
	names = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// Register makes fn the Go tool name. It panics on a name a config could
// not declare, a nil fn, or a name registered twice: mistakes of a main,
// found when it starts (as http.Handle and sql.Register do).
func Register(name string, fn Func) {
	if !names.MatchString(name) {
		panic(fmt.Sprintf("tool: Register(%q): want 1 to 64 letters, digits, '_' or '-'", name))
	}
	if fn == nil {
		panic(fmt.Sprintf("tool: Register(%q): nil Func", name))
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := funcs[name]; dup {
		panic(fmt.Sprintf("tool: Register(%q) twice", name))
	}
	funcs[name] = fn
}

// Lookup returns the Go tool name, if this process registered it.
func Lookup(name string) (Func, bool) {
	mu.RLock()
	defer mu.RUnlock()
	fn, ok := funcs[name]
	return fn, ok
}

// Registered lists the Go tools this process registered, sorted.
func Registered() []string {
	mu.RLock()
	defer mu.RUnlock()
	var out []string
	for n := range funcs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
