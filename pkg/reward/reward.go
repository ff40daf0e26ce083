// Package reward scores a final answer against its label: SQuAD-style exact
// match and token F1 computed locally, or a remote reward server over HTTP.
package reward

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/redirect"
)

// Normalize lowers s, removes punctuation and the articles a, an and the,
// and collapses white space, as the SQuAD evaluation script does. Before
// that, s is brought to Unicode's NFKC form and its format characters
// (category Cf: zero-width spaces and joiners, byte-order marks, bidi
// marks) are dropped, so that what reads the same compares the same: an
// accent written as a combining mark ("cafe\u0301") or precomposed
// ("café"), full-width letters ("ＰＡＲＩＳ") or plain ones, a ligature
// ("ﬁ") or its letters. Greek's final sigma "ς" is "σ": lower-casing
// makes every "Σ" a "σ", and "ΟΔΥΣΣΕΥΣ" must compare as "Οδυσσευς" does.
func Normalize(s string) string { return normalize(s, true) }

// normalize is Normalize, dropping the articles only when articles is set.
func normalize(s string, articles bool) string {
	s = strings.ToLower(norm.NFKC.String(s))
	var b strings.Builder
	for _, r := range s {
		if unicode.IsPunct(r) || unicode.IsSymbol(r) || unicode.Is(unicode.Cf, r) {
			continue
		}
		if r == 'ς' {
			r = 'σ'
		}
		b.WriteRune(r)
	}
	words := strings.Fields(b.String())
	if !articles {
		return strings.Join(words, " ")
	}
	out := words[:0]
	for _, w := range words {
		switch w {
		case "a", "an", "the":
			continue
		}
		out = append(out, w)
	}
	return strings.Join(out, " ")
}

// Answers splits a label into its accepted answers (separated by "|"),
// dropping empty ones. A label that is a JSON list of strings or numbers
// (what a trainer sends for a dataset's list of answers, json.dumps of
// ["Paris", "City of Light"]) is that list: read as text, its brackets and
// quotes would make no answer match.
func Answers(label string) []string {
	if list, ok := jsonAnswers(label); ok {
		return list
	}
	var out []string
	for _, a := range strings.Split(label, "|") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// jsonAnswers reads a label that is a JSON list whose items are all
// strings or numbers; ok is false for any other label.
func jsonAnswers(label string) (out []string, ok bool) {
	label = strings.TrimSpace(label)
	if !strings.HasPrefix(label, "[") {
		return nil, false
	}
	var items []json.RawMessage
	if json.Unmarshal([]byte(label), &items) != nil {
		return nil, false
	}
	for _, item := range items {
		var s string
		if json.Unmarshal(item, &s) != nil {
			var n json.Number
			if json.Unmarshal(item, &n) != nil {
				return nil, false
			}
			s = n.String()
		}
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out, true
}

// compared is the form of s that ExactMatch and F1 compare: Normalize(s),
// or, when that drops every word (a multiple-choice "A", the band "The
// The"), s normalized with its articles kept. Without the fallback such an
// answer normalizes to nothing, and so does a missing answer: an episode
// that answered nothing would be right.
func compared(s string) string {
	if n := Normalize(s); n != "" {
		return n
	}
	return normalize(s, false)
}

// ExactMatch is 1 when the normalized prediction equals one of the label's
// normalized answers, else 0. A prediction with no words (no answer) is 0.
func ExactMatch(pred, label string) float64 {
	p := compared(pred)
	if p == "" {
		return 0
	}
	for _, a := range Answers(label) {
		if compared(a) == p {
			return 1
		}
	}
	return 0
}

// F1 is the best token-overlap F1 between the prediction and any of the
// label's answers (SQuAD definition: bag of normalized words). A
// prediction with no words (no answer) is 0.
func F1(pred, label string) float64 {
	best := 0.0
	for _, a := range Answers(label) {
		best = max(best, f1(pred, a))
	}
	return best
}

func f1(pred, gold string) float64 {
	pt := strings.Fields(compared(pred))
	gt := strings.Fields(compared(gold))
	if len(pt) == 0 || len(gt) == 0 {
		return 0
	}
	count := make(map[string]int, len(gt))
	for _, t := range gt {
		count[t]++
	}
	common := 0
	for _, t := range pt {
		if count[t] > 0 {
			count[t]--
			common++
		}
	}
	if common == 0 {
		return 0
	}
	precision := float64(common) / float64(len(pt))
	recall := float64(common) / float64(len(gt))
	return 2 * precision * recall / (precision + recall)
}

// Builtin returns the built-in reward function name ("em": ExactMatch,
// "f1": F1), ok false for another name. Unlike ExactMatch and F1, it
// refuses a label that holds no answer (empty, only "|", an empty JSON
// list, answers of punctuation alone): there is nothing to compare with,
// and a task that cannot be scored is a reward error, not a wrong answer
// worth 0.
func Builtin(name string) (Func, bool) {
	var score func(pred, label string) float64
	switch name {
	case "em":
		score = ExactMatch
	case "f1":
		score = F1
	default:
		return nil, false
	}
	return func(_ context.Context, _, answer, label string) (float64, error) {
		if !slices.ContainsFunc(Answers(label), func(a string) bool { return compared(a) != "" }) {
			return 0, fail.Invalidf("reward %s: the task's label %.100q holds no answer to compare with", name, label)
		}
		return score(answer, label), nil
	}, true
}

// Remote asks a reward server for a score. The server receives
// {"prompt","response","label"} as JSON and replies with a JSON number or
// an object {"reward": x}.
type Remote struct {
	URL  string
	HTTP *http.Client // nil means http.DefaultClient
}

// maxReply is the most a reward server's reply is read of (a score is a
// few bytes).
const maxReply = 1 << 20

// Score posts one scoring request. Connection errors, time-outs, 429 and 5xx
// are transient; other 4xx, redirects elsewhere (see redirect.SameHostPOST) and
// unreadable replies are permanent.
func (r Remote) Score(ctx context.Context, prompt, response, label string) (float64, error) {
	body, err := json.Marshal(map[string]string{"prompt": prompt, "response": response, "label": label})
	if err != nil {
		return 0, fail.E(fail.Invalid, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(body))
	if err != nil {
		return 0, fail.Permanentf("reward: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	hc := r.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := redirect.SameHostPOST(hc).Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("reward: %w", ctx.Err())
		}
		return 0, fail.Transientf("reward: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return 0, fail.Transientf("reward: read reply: %w", err)
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 && resp.Header.Get("Location") != "" {
		return 0, fail.Permanentf("reward: %s to %q: a reward server answers the POST itself (a redirect is followed only to the same scheme and host, keeping the POST: 307 or 308)",
			resp.Status, resp.Header.Get("Location"))
	}
	if resp.StatusCode != http.StatusOK {
		// The reply is quoted in part: the error goes into every sample
		// of the episode and into logs, and an error page may be large.
		err := fmt.Errorf("reward: %s: %.200q", resp.Status, bytes.TrimSpace(data))
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
			return 0, fail.E(fail.Transient, err)
		}
		return 0, fail.E(fail.Permanent, err)
	}
	if len(data) > maxReply {
		// Cut at the limit, it could decode as another score, or fail to
		// decode for a reason that is not the server's.
		return 0, fail.Permanentf("reward: the reply is over %d bytes (%.100q…): want a number or {\"reward\": number}", maxReply, data)
	}
	return decodeScore(data)
}

// decodeScore reads a reward server's reply: a number, or an object whose
// "reward" is one. A reply that holds no score (null, Python's
// json.dumps(None)) is refused, never read as 0.
func decodeScore(data []byte) (float64, error) {
	var x *float64
	if err := json.Unmarshal(data, &x); err == nil {
		if x == nil {
			return 0, fail.Permanentf("reward: the server answered null (%.100q): want a number or {\"reward\": number}", data)
		}
		return *x, nil
	}
	var obj struct {
		Reward *float64 `json:"reward"`
	}
	if err := json.Unmarshal(data, &obj); err != nil || obj.Reward == nil {
		if err == nil {
			err = errors.New(`no "reward" field`)
		}
		return 0, fail.Permanentf("reward: decode reply %.100q: %w", data, err)
	}
	return *obj.Reward, nil
}
