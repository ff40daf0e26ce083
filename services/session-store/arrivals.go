package sessionstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// A role arrives once per rollout. Another arrival of the role is the same
// one sent again when it asks for the same (engine, weight version, config,
// tasks: its digest), whatever its message id, attempt or time: that is
// harmless. One that asks for something else is refused, naming what
// differs: the rollout goes on with the first. The same holds between the
// roles for the task list: the first list stored is the rollout's, and an
// arrival of the other role that brings another is refused.

// arrivalSum is what an arrival asks for, summed.
type arrivalSum struct {
	tasks  string // its task list's digest (TaskList.Digest); "" without tasks
	count  int    // its tasks, when inline
	config string // its config's, defaults applied; "" without one
	digest string // engine, weight version, config and tasks
}

// sumArrival sums a: its task list by content (the object store's digest
// of an object), the rest with it.
func (s *Service) sumArrival(ctx context.Context, a *schema.Arrive) (arrivalSum, error) {
	var x arrivalSum
	switch {
	case len(a.Tasks) > 0:
		x.tasks, x.count = schema.TasksDigest(a.Tasks), len(a.Tasks)
	case a.TasksObject != "":
		// The digest the arrival names (validateArrival checked it is
		// one): every reader of the object checks its bytes against it.
		x.tasks = schema.DigestSHA256 + a.TasksSHA256
	}
	if a.Config != nil {
		// A config that spells out a default asks for the same as one that
		// leaves it out.
		x.config = digest(a.Config.WithDefaults())
	}
	x.digest = digest(struct {
		Engine        schema.Engine    `json:"engine"`
		WeightVersion string           `json:"weight_version"`
		Config        string           `json:"config"`
		Tasks         string           `json:"tasks"`
		Sampling      *schema.Sampling `json:"sampling,omitempty"` // left out without one: the digest of arrivals before it
	}{a.Engine, a.WeightVersion, x.config, x.tasks, a.Sampling})
	return x, nil
}

// digest sums v's JSON (maps in key order).
func digest(v any) string {
	body, err := json.Marshal(v)
	if err != nil {
		return "unencodable: " + err.Error()
	}
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// differences says what another arrival of a role asks for that its first
// arrival, first, did not. sess is the rollout's session: the config it
// holds is the first arrival's when that arrival's config was taken.
func differences(sess *schema.Session, first schema.RoleInfo, a *schema.Arrive, x arrivalSum) []string {
	var out []string
	if first.Engine != a.Engine {
		for _, f := range []struct{ name, was, now string }{
			{"url", first.Engine.URL, a.Engine.URL}, {"protocol", first.Engine.Protocol, a.Engine.Protocol}, {"model", first.Engine.Model, a.Engine.Model},
		} {
			if f.was != f.now {
				out = append(out, fmt.Sprintf("engine.%s %q, was %q", f.name, f.now, f.was))
			}
		}
		if first.Engine.MaxInFlight != a.Engine.MaxInFlight {
			out = append(out, fmt.Sprintf("engine.max_in_flight %d, was %d", a.Engine.MaxInFlight, first.Engine.MaxInFlight))
		}
	}
	if first.WeightVersion != a.WeightVersion {
		out = append(out, fmt.Sprintf("weight_version %q, was %q", a.WeightVersion, first.WeightVersion))
	}
	switch {
	case first.ConfigDigest == x.config:
	case first.ConfigDigest == "":
		out = append(out, "a config, the first arrival had none")
	case x.config == "":
		out = append(out, "no config, the first arrival had one")
	case sess.ConfigFrom == a.Role:
		out = append(out, "config "+configDiff(sess.Config.WithDefaults(), a.Config.WithDefaults()))
	default:
		out = append(out, "another config than the first arrival's")
	}
	if was, now := samplingJSON(first.Sampling), samplingJSON(a.Sampling); was != now {
		out = append(out, "sampling "+now+", was "+was)
	}
	if first.Tasks != x.tasks {
		out = append(out, "tasks "+describeTasks(x.tasks, x.count)+", was "+describeTasks(first.Tasks, -1))
	}
	if len(out) == 0 {
		out = append(out, "a body whose digest differs ("+short(x.digest)+", was "+short(first.Digest)+")")
	}
	return out
}

// samplingJSON is an arrival's own sampling as JSON, "none" without one.
func samplingJSON(s *schema.Sampling) string {
	if s == nil {
		return "none"
	}
	data, _ := json.Marshal(s)
	return string(data)
}

// configDiff names the fields of two configurations that differ, with
// their values where they are short.
func configDiff(was, now schema.Config) string {
	fields := func(c schema.Config) map[string]any {
		data, _ := json.Marshal(c)
		m := map[string]any{}
		_ = json.Unmarshal(data, &m)
		return m
	}
	w, n := fields(was), fields(now)
	keys := slices.Sorted(maps.Keys(w))
	for k := range n {
		if _, ok := w[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		if reflect.DeepEqual(w[k], n[k]) {
			continue
		}
		a, _ := json.Marshal(n[k])
		b, _ := json.Marshal(w[k])
		if len(a)+len(b) <= 80 {
			out = append(out, fmt.Sprintf("%s %s, was %s", k, orNone(a, n[k]), orNone(b, w[k])))
		} else {
			out = append(out, k)
		}
	}
	return strings.Join(out, ", ")
}

func orNone(data []byte, v any) string {
	if v == nil {
		return "unset"
	}
	return string(data)
}

// describeTasks names a task list by its digest (and size, when known).
func describeTasks(digest string, count int) string {
	switch {
	case digest == "":
		return "none"
	case count > 0:
		return fmt.Sprintf("%d (%s)", count, short(digest))
	}
	return short(digest)
}

func short(digest string) string {
	if len(digest) > 23 {
		return digest[:23] + "…"
	}
	return digest
}

// disagreement is the error that refuses an arrival that asks for
// something else than the arrival that counted.
func disagreement(n int64, role string, first schema.RoleInfo, diffs []string) error {
	return fail.Invalidf("rollout %d: the %s arrived already (%s, at %s) and this arrival asks for something else: %s. The rollout goes on with the first arrival: send it again unchanged, or use a new rollout id",
		n, role, first.ArrivalID, time.UnixMilli(first.ArrivedMs).UTC().Format(time.RFC3339), strings.Join(diffs, "; "))
}
