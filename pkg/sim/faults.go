package sim

import (
	"hash/fnv"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/planact/planact/pkg/reward"
)

// Fault markers. A prompt that contains one makes the engine misbehave in
// that way, so that a test can break one task of a batch. A marker followed
// by ":<n>" (see FaultTimes) fires only the first n times for the same
// question (planner) or input (actor), so that retries and re-plans recover.
//
// The planner engine reacts to FaultError, FaultHang and the plan faults; the
// actor engine to FaultError, FaultHang and the actor faults; both to
// FaultBusy and FaultUnavailable. The simulated
// planner copies actor markers found in the question into the query of the
// first node of each plan it writes, so they reach the actor's Input.
const (
	FaultError         = "#fault:error"          // the engine replies 500
	FaultHang          = "#fault:hang"           // the engine never replies (until the request ends)
	FaultMalformedPlan = "#fault:malformed-plan" // the plan does not parse
	FaultCyclicPlan    = "#fault:cyclic-plan"    // the plan has a dependency cycle
	FaultTruncatedPlan = "#fault:truncated-plan" // the plan is cut off (finish reason "length")
	FaultToolInvalid   = "#fault:tool-invalid"   // the plan calls a tool that is not offered ("browse")
	FaultActorError    = "#fault:actor-error"    // the actor engine replies 500
	FaultActorHang     = "#fault:actor-hang"     // the actor engine never replies
	FaultActorWrong    = "#fault:actor-wrong"    // the actor answers a wrong fact
	// FaultBusy: either engine replies 429 Too Many Requests with a
	// Retry-After header (Config.RetryAfter), as a loaded server or router does.
	FaultBusy = "#fault:busy"
	// FaultUnavailable: either engine replies 503 Service Unavailable
	// without Retry-After, so that clients back off on their own.
	FaultUnavailable = "#fault:unavailable"
)

// FaultTimes returns a marker that fires only the first n times.
func FaultTimes(marker string, n int) string { return marker + ":" + strconv.Itoa(n) }

// InvalidTool is the tool name a FaultToolInvalid plan uses.
const InvalidTool = "browse"

var markerRe = regexp.MustCompile(`#fault:([a-z][a-z-]*)(?::([0-9]+))?`)

// marker is one fault marker found in a prompt.
type marker struct {
	kind  string // without "#fault:"
	times int    // 0 = always
	text  string // as written
}

func findMarkers(s string) []marker {
	var out []marker
	for _, m := range markerRe.FindAllStringSubmatch(s, -1) {
		n, _ := strconv.Atoi(m[2])
		out = append(out, marker{kind: m[1], times: n, text: m[0]})
	}
	return out
}

func stripMarkers(s string) string {
	return strings.TrimSpace(markerRe.ReplaceAllString(s, ""))
}

// normQuery is the form in which lookups are compared.
func normQuery(s string) string { return reward.Normalize(stripMarkers(s)) }

// hash64 mixes the seed and parts into a 64-bit value.
func hash64(seed int64, parts ...string) uint64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return splitmix(h.Sum64() ^ splitmix(uint64(seed)))
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// unit maps a hash to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

// roll reports whether an event of probability p happens, deterministically.
func roll(p float64, seed int64, parts ...string) bool {
	if p <= 0 {
		return false
	}
	return unit(hash64(seed, parts...)) < p
}

// LogProb is the log-probability the engine of seed gives output token i
// (id) of a generation from prompt: a reader of samples can tell a
// generated token from one the engine never returned (the chaos ledger).
func LogProb(seed int64, prompt string, i, id int) float64 {
	return logProb(seed, hash64(seed, prompt), i, id)
}

// logProb is the deterministic log-probability of output token i.
func logProb(seed int64, promptHash uint64, i, id int) float64 {
	u := unit(splitmix(promptHash ^ splitmix(uint64(seed)+uint64(i)*0x100000001b3+uint64(id))))
	lp := -0.001 - 2.5*u*u
	return math.Round(lp*1e6) / 1e6
}
