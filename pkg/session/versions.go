package session

import (
	"fmt"
	"sync"

	"github.com/planact/planact/pkg/schema"
)

// Versions remembers the weight version each engine last reported, so that
// the version of the weights a generation will run on is known before it
// starts: what bounded staleness decides on.
type Versions struct {
	mu   sync.Mutex
	last map[string]string // engine url -> version
}

// Note records what the engine at url reported.
func (v *Versions) Note(url, version string) {
	if version == "" {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.last == nil {
		v.last = map[string]string{}
	}
	v.last[url] = version
}

// Of is the version the engine at url runs, as far as planact knows: what
// it last reported, else fallback.
func (v *Versions) Of(url, fallback string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if s := v.last[url]; s != "" {
		return s
	}
	return fallback
}

// Stale says why work is not started on weights of version, when they are
// more than max versions behind the role's newest (max 0: no bound); "" when
// it may start.
func Stale(newest, version string, max int) string {
	if max <= 0 {
		return ""
	}
	if behind, ok := schema.Behind(newest, version); ok && behind > int64(max) {
		return fmt.Sprintf("the engine's weights %s are %d versions behind the trainer's %s (max_staleness %d)", version, behind, newest, max)
	}
	return ""
}
