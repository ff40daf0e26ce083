package client

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// LagGroupReads makes c's direct gets of group subjects answer, bad times
// each, as the stream's replicas may before they hold the group: the
// first as a server away (no answer), the next as a follower behind
// (nothing there). With wildcard, the read of a rollout's last group
// message (the subject of every group) lags as well.
func LagGroupReads(c *Client, bad int, wildcard bool) {
	var mu sync.Mutex
	reads := map[string]int{}
	c.get = func(ctx context.Context, subj string) (*nats.Msg, error) {
		if strings.Contains(subj, ".group.") && (wildcard || !strings.HasSuffix(subj, ".*")) {
			mu.Lock()
			reads[subj]++
			k := reads[subj]
			mu.Unlock()
			switch {
			case k == 1:
				return nil, nats.ErrTimeout
			case k <= bad:
				return &nats.Msg{Subject: subj, Header: nats.Header{"Status": []string{"404"}}}, nil
			}
		}
		return c.nc.RequestWithContext(ctx, subj, nil)
	}
}

// Arrivals counts the arrivals c remembers.
func Arrivals(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.arrived)
}

// KeepArrivals makes a client remember k arrivals at most, until undo.
func KeepArrivals(k int) (undo func()) {
	was := maxArrivals
	maxArrivals = k
	return func() { maxArrivals = was }
}

// SetPauseAnswerMargin sets how long Pause waits past a pause's time-out,
// and returns a func that sets it back.
func SetPauseAnswerMargin(d time.Duration) func() {
	was := pauseAnswerMargin
	pauseAnswerMargin = d
	return func() { pauseAnswerMargin = was }
}

// SetResumeAnswerWait sets how long Resume waits for planact's answer, and
// returns a func that sets it back.
func SetResumeAnswerWait(d time.Duration) func() {
	was := resumeAnswerWait
	resumeAnswerWait = d
	return func() { resumeAnswerWait = was }
}

// SetNow sets the clock that stamps pauses, resumes and cancels, and returns a func
// that sets it back.
func SetNow(f func() time.Time) func() {
	was := now
	now = f
	return func() { now = was }
}
