package main

import (
	"fmt"

	"github.com/planact/planact/pkg/schema"
)

// progressCounts are a running rollout's progress as its status events
// tell it: episodes ended of all, and the acts of the ended episodes. The
// session-store publishes them from handlers that run at once, so they
// may arrive in another order than they were counted; each count only
// grows.
type progressCounts struct {
	episodes, ended, acts int
}

// advance takes what a status event says; it reports whether a count grew.
// An older event (fewer ended, fewer acts) changes nothing.
func (c *progressCounts) advance(episodes, ended, acts int) bool {
	grew := false
	for _, f := range []struct {
		have *int
		said int
	}{{&c.episodes, episodes}, {&c.ended, ended}, {&c.acts, acts}} {
		if f.said > *f.have {
			*f.have, grew = f.said, true
		}
	}
	return grew
}

// submitProgress is what `planact submit` shows of its rollout: waiting at
// the barrier, started, episodes ending, finished. What it shows only moves
// forward: a status event that arrives after a later one (published by
// another handler, or another session-store replica) is not shown, and
// nothing comes after "finished".
type submitProgress struct {
	rollout  int64
	stage    int // stageWaiting … stageFinished
	detail   string
	counts   progressCounts
	finished string
}

const (
	stageWaiting = iota
	stageStarted
	stageRunning
	stageFinished
)

// apply takes one status event and returns the line to show when what is
// shown moved forward, "" otherwise.
func (p *submitProgress) apply(st schema.Status) string {
	switch {
	case p.stage == stageFinished:
		return ""
	case st.Event == "finished":
		p.stage, p.finished = stageFinished, st.Detail
	case st.Episodes > 0:
		if !p.counts.advance(st.Episodes, st.Ended, st.Acts) && p.stage == stageRunning {
			return ""
		}
		p.stage = stageRunning
	case st.Event == "started" && p.stage < stageStarted:
		p.stage, p.detail = stageStarted, st.Detail
	default:
		return ""
	}
	return p.line()
}

// line is what p shows now.
func (p *submitProgress) line() string {
	switch p.stage {
	case stageStarted:
		return fmt.Sprintf("rollout %d: started, %s", p.rollout, p.detail)
	case stageRunning:
		return fmt.Sprintf("rollout %d: %d/%d episodes ended, %d acts", p.rollout, p.counts.ended, p.counts.episodes, p.counts.acts)
	case stageFinished:
		return fmt.Sprintf("rollout %d: finished, %s", p.rollout, p.finished)
	}
	return fmt.Sprintf("rollout %d: waiting for both roles", p.rollout)
}
