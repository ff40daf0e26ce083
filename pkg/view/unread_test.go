package view

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
)

// TestNotFoundOnlyOnceTheHistoryIsRead: a view just opened has not read
// the streams' history yet. A rollout or an episode it does not know then
// may be one it has not read yet: it waits for the history (as long as
// the caller's context lets it) rather than say not found; once read, not
// found is not found. Before, a web view just started (or started again)
// answered 404 for every rollout it had not read yet, and a page open in a
// browser, connecting again, showed "not found" and stopped following it.
func TestNotFoundOnlyOnceTheHistoryIsRead(t *testing.T) {
	f := newFolder(t, &state{})
	r := &Reader{st: *f.st, seqs: map[string]uint64{}, until: map[string]uint64{bus.StreamRollout: 40}, runs: true,
		subs: map[chan struct{}]bool{}, now: func() time.Time { return f.now }}
	f.st = &r.st

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for what, err := range map[string]error{
		"rollout": func() error { _, err := r.RolloutContext(ended, 4, Filter{}); return err }(),
		"episode": func() error { _, err := r.EpisodeContext(ended, 4, 1); return err }(),
	} {
		if err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "history not read yet") {
			t.Errorf("%s of rollout 4 before the history is read, asked with a context that ended: %v; want it not read yet, not not found", what, err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type answer struct {
		ro  *Rollout
		ep  *Episode
		err error
	}
	answers := make(chan answer, 2)
	go func() {
		ro, err := r.RolloutContext(ctx, 4, Filter{})
		answers <- answer{ro: ro, err: err}
	}()
	go func() {
		ep, err := r.EpisodeContext(ctx, 4, 1)
		answers <- answer{ep: ep, err: err}
	}()
	// The history is read: rollout 4 was in it.
	r.mu.Lock()
	f.finished(4, 2)
	r.seqs[bus.StreamRollout] = 40
	r.mu.Unlock()
	for range 2 {
		a := <-answers
		if a.err != nil || (a.ro == nil && a.ep == nil) {
			t.Fatalf("rollout 4, in the history read: %v", a.err)
		}
		if a.ro != nil && (a.ro.Rollout != 4 || len(a.ro.EpisodeList) != 2) {
			t.Errorf("rollout %d with %d episodes, want rollout 4 with 2", a.ro.Rollout, len(a.ro.EpisodeList))
		}
		if a.ep != nil && (a.ep.Rollout != 4 || a.ep.Episode != 1) {
			t.Errorf("episode %d of rollout %d, want episode 1 of rollout 4", a.ep.Episode, a.ep.Rollout)
		}
	}
	// Read, what it does not hold is not found, at once.
	if _, err := r.RolloutContext(ended, 5, Filter{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("rollout 5 once the history is read: %v, want %v", err, ErrNotFound)
	}
	if _, err := r.EpisodeContext(ended, 4, 2); !errors.Is(err, ErrNotFound) {
		t.Errorf("episode 2 of rollout 4 (of 2) once the history is read: %v, want %v", err, ErrNotFound)
	}
}
