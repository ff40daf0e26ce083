package view

import (
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"

	"github.com/planact/planact/pkg/schema"
)

// Filter picks episodes of a rollout. The zero Filter picks them all.
type Filter struct {
	// Status keeps the episodes in that status (running, unfinished,
	// completed, truncated, failed, aborted, quarantined); "" keeps all.
	Status string `json:"status,omitempty"`
	// Lowest, when above 0, keeps the Lowest ended episodes with the
	// lowest rewards, lowest first.
	Lowest int `json:"lowest,omitempty"`
}

// EpisodeStatuses are the statuses a Filter may name.
var EpisodeStatuses = []string{EpisodeRunning, EpisodeUnfinished, schema.EpisodeCompleted, schema.EpisodeTruncated, schema.EpisodeFailed, schema.EpisodeAborted, schema.EpisodeQuarantined}

// MaxLowest bounds Filter.Lowest.
const MaxLowest = 100000

// ParseFilter reads a Filter from query parameters status and lowest,
// naming the parameter that is wrong.
func ParseFilter(q url.Values) (Filter, error) {
	var f Filter
	if st := q.Get("status"); st != "" {
		if !slices.Contains(EpisodeStatuses, st) {
			return f, fmt.Errorf("status %q: want one of %v", st, EpisodeStatuses)
		}
		f.Status = st
	}
	if l := q.Get("lowest"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > MaxLowest {
			return f, fmt.Errorf("lowest %q: want a number of episodes from 1 to %d", l, MaxLowest)
		}
		f.Lowest = n
	}
	return f, nil
}

// apply returns the episodes that pass the filter, in episode order or,
// with Lowest, by reward, lowest first.
func (f Filter) apply(eps []EpisodeSummary) []EpisodeSummary {
	out := make([]EpisodeSummary, 0, len(eps))
	for _, e := range eps {
		if f.Status != "" && e.Status != f.Status {
			continue
		}
		if f.Lowest > 0 && (e.Status == EpisodeRunning || e.Status == EpisodeUnfinished) {
			continue
		}
		out = append(out, e)
	}
	if f.Lowest > 0 {
		sort.SliceStable(out, func(i, j int) bool { return rewardOf(out[i]) < rewardOf(out[j]) })
		out = out[:min(f.Lowest, len(out))]
	}
	return out
}

func rewardOf(e EpisodeSummary) float64 {
	if e.Reward == nil {
		return 0
	}
	return *e.Reward
}
