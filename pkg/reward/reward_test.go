package reward

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/planact/planact/pkg/fail"
)

func TestNormalize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"The Eiffel Tower!", "eiffel tower"},
		{"  a  b   c ", "b c"},
		{"Washington, D.C.", "washington dc"},
		{"An apple", "apple"},
		{"", ""},
		{"2.1 million", "21 million"},
	} {
		if got := Normalize(tc.in); got != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestExactMatchAndF1(t *testing.T) {
	for _, tc := range []struct {
		pred, label string
		em, f1      float64
	}{
		{"Paris", "Paris", 1, 1},
		{"paris.", "Paris", 1, 1},
		{"the city of Paris", "Paris", 0, 0.5},
		{"Lyon", "Paris", 0, 0},
		{"USA", "United States|USA", 1, 1},
		{"United States of America", "United States|USA", 0, 2.0 / 3},
		{"", "Paris", 0, 0},
		{"Paris", "", 0, 0},
		{"2.1 million", "2.1 million", 1, 1},
		{"3.7 million", "2.1 million", 0, 0.5},
	} {
		if got := ExactMatch(tc.pred, tc.label); got != tc.em {
			t.Errorf("ExactMatch(%q, %q) = %v, want %v", tc.pred, tc.label, got, tc.em)
		}
		if got := F1(tc.pred, tc.label); math.Abs(got-tc.f1) > 1e-9 {
			t.Errorf("F1(%q, %q) = %v, want %v", tc.pred, tc.label, got, tc.f1)
		}
	}
}

func TestRemote(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   float64
		kind   fail.Kind // Unknown means no error
	}{
		{"number", 200, "0.75", 0.75, fail.Unknown},
		{"object", 200, `{"reward": 1}`, 1, fail.Unknown},
		{"garbage", 200, `"x"`, 0, fail.Permanent},
		{"bad request", 400, `no`, 0, fail.Permanent},
		{"busy", 429, ``, 0, fail.Transient},
		{"server error", 503, ``, 0, fail.Transient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var in map[string]string
				if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in["label"] != "Paris" || in["response"] != "Lyon" {
					t.Errorf("request body = %v, %v", in, err)
				}
				w.WriteHeader(tc.status)
				w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			got, err := Remote{URL: srv.URL}.Score(context.Background(), "q", "Lyon", "Paris")
			if tc.kind == fail.Unknown {
				if err != nil || got != tc.want {
					t.Fatalf("Score = %v, %v; want %v", got, err, tc.want)
				}
				return
			}
			if fail.KindOf(err) != tc.kind {
				t.Fatalf("Score error = %v (kind %v), want kind %v", err, fail.KindOf(err), tc.kind)
			}
		})
	}
}

func TestRemoteConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := Remote{URL: url}.Score(context.Background(), "", "", "")
	if fail.KindOf(err) != fail.Transient {
		t.Fatalf("error %v kind %v, want transient", err, fail.KindOf(err))
	}
}

// TestRemoteRefusesWhatSaysNoScore: a reward server that answers 200 with
// null (Python's json.dumps(None)) said no score; it used to be read as
// the reward 0, with no error. It is refused, the reply quoted.
func TestRemoteRefusesWhatSaysNoScore(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"null", `the server answered null`},
		{" null\n", `the server answered null`},
		{`{"reward": null}`, `no "reward" field`},
		{`{}`, `no "reward" field`},
		{``, `decode reply ""`},
		{`[0.5]`, `decode reply "[0.5]"`},
		{`true`, `decode reply "true"`},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(tc.body)) }))
		got, err := Remote{URL: srv.URL}.Score(context.Background(), "q", "Lyon", "Paris")
		srv.Close()
		if err == nil || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("reply %q: reward %v, error %v (kind %v); want a permanent error saying %s", tc.body, got, err, fail.KindOf(err), tc.want)
		}
	}
}

// TestNormalizeUnicode: exact match and F1 compare what a reader sees, not
// how it was encoded: a decomposed accent, full-width letters, ligatures
// and zero-width characters used to make a right answer score 0.
func TestNormalizeUnicode(t *testing.T) {
	for _, tc := range []struct {
		pred, label string
		em, f1      float64
	}{
		{"cafe\u0301", "café", 1, 1},                    // decomposed e + combining acute
		{"café", "cafe\u0301", 1, 1},                    // and the other way round
		{"ＰＡＲＩＳ", "Paris", 1, 1},                        // full-width
		{"Pa\u200bris", "Paris", 1, 1},                  // zero-width space
		{"\ufeffParis\u200d", "Paris", 1, 1},            // BOM, zero-width joiner
		{"ﬁne art", "fine art", 1, 1},                   // ligature
		{"the Eiffel\u00a0Tower", "Eiffel Tower", 1, 1}, // no-break space
		{"Pari", "Paris", 0, 0},                         // still a different word
		{"resume", "résumé", 0, 0},                      // accents still count
	} {
		if got := ExactMatch(tc.pred, tc.label); got != tc.em {
			t.Errorf("ExactMatch(%q, %q) = %v, want %v", tc.pred, tc.label, got, tc.em)
		}
		if got := F1(tc.pred, tc.label); math.Abs(got-tc.f1) > 1e-9 {
			t.Errorf("F1(%q, %q) = %v, want %v", tc.pred, tc.label, got, tc.f1)
		}
	}
}

// TestRemoteBoundsReply: a reward server's reply is read up to 1 MiB. An
// error page quotes only its start (the error goes into every sample of the
// episode), and a 200 reply over the limit is refused as such, never cut
// into another score.
func TestRemoteBoundsReply(t *testing.T) {
	big := strings.Repeat("x", 2<<20)
	for _, tc := range []struct {
		name, body, want string
		status           int
		kind             fail.Kind
	}{
		{"error page", "<html>" + big, "503 Service Unavailable", 503, fail.Transient},
		{"refusal", "no: " + big, "400 Bad Request", 400, fail.Permanent},
		{"score cut", "1" + strings.Repeat(" ", 1<<20) + "0", "over 1048576 bytes", 200, fail.Permanent},
		{"padded object", `{"reward": 1, "pad": "` + big + `"}`, "over 1048576 bytes", 200, fail.Permanent},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			w.Write([]byte(tc.body))
		}))
		got, err := Remote{URL: srv.URL}.Score(context.Background(), "q", "Lyon", "Paris")
		srv.Close()
		if err == nil || fail.KindOf(err) != tc.kind || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 1000 {
			msg := "<nil>"
			if err != nil {
				msg = err.Error()
			}
			t.Errorf("%s: reward %v, error of %d bytes %.200q (kind %v); want a %v error saying %s, under 1000 bytes", tc.name, got, len(msg), msg, fail.KindOf(err), tc.kind, tc.want)
		}
	}
}

// TestJSONListLabel: a label that is a JSON list (a dataset's list of
// answers, which the Python trainer sends as json.dumps of the list) is
// that list of answers; it used to be read as one answer, brackets and
// all, so that no answer matched exactly.
func TestJSONListLabel(t *testing.T) {
	for _, tc := range []struct {
		pred, label string
		em, f1      float64
	}{
		{"Paris", `["Lutetia", "Paris"]`, 1, 1},
		{"city of light", ` ["Paris", "City of Light"] `, 1, 1},
		{"1990", `[1990, "nineteen ninety"]`, 1, 1},
		{"Lyon", `["Paris"]`, 0, 0},
		{"Paris", `[]`, 0, 0},
		{"[Paris]", `[Paris]`, 1, 1}, // not JSON: one answer, as written
	} {
		if got := ExactMatch(tc.pred, tc.label); got != tc.em {
			t.Errorf("ExactMatch(%q, %q) = %v, want %v", tc.pred, tc.label, got, tc.em)
		}
		if got := F1(tc.pred, tc.label); math.Abs(got-tc.f1) > 1e-9 {
			t.Errorf("F1(%q, %q) = %v, want %v", tc.pred, tc.label, got, tc.f1)
		}
	}
	if got := Answers(`["Paris", "", "Lutetia|Lucotecia"]`); strings.Join(got, ";") != "Paris;Lutetia|Lucotecia" {
		t.Errorf("Answers of a list = %q", got)
	}
}

// TestNormalizeGreekFinalSigma: a Greek answer in capitals matches the
// same word in lower case, whose last sigma is the final form "ς"
// (lower-casing made every "Σ" a "σ", and the two never matched).
func TestNormalizeGreekFinalSigma(t *testing.T) {
	for _, tc := range []struct{ pred, label string }{
		{"ΟΔΥΣΣΕΥΣ", "Οδυσσευς"},
		{"Οδυσσευς", "ΟΔΥΣΣΕΥΣ"},
		{"ΑΘΗΝΑΣ ΠΟΛΗ", "αθηνας πολη"},
	} {
		if got := ExactMatch(tc.pred, tc.label); got != 1 {
			t.Errorf("ExactMatch(%q, %q) = %v, want 1", tc.pred, tc.label, got)
		}
		if got := F1(tc.pred, tc.label); got != 1 {
			t.Errorf("F1(%q, %q) = %v, want 1", tc.pred, tc.label, got)
		}
	}
}

// TestBuiltinRefusesLabelWithoutAnswer: em and f1 compare an answer with
// the task's label; a label that holds no answer (empty, only separators,
// an empty JSON list) cannot score anything. It used to be scored 0 with no
// error, so that every episode of unlabelled tasks looked wrong instead of
// unscored. It is a reward error naming the label; a label with an answer
// scores as ExactMatch and F1 do.
func TestBuiltinRefusesLabelWithoutAnswer(t *testing.T) {
	for _, name := range []string{"em", "f1"} {
		fn, ok := Builtin(name)
		if !ok {
			t.Fatalf("Builtin(%q) not found", name)
		}
		for _, label := range []string{"", "   ", "|", " | ", "[]", `[""]`} {
			got, err := fn(context.Background(), "q", "Paris", label)
			if err == nil || fail.KindOf(err) != fail.Invalid || !strings.Contains(err.Error(), "reward "+name) || !strings.Contains(err.Error(), "holds no answer") {
				t.Errorf("%s with label %q: reward %v, error %v; want an invalid-input error saying the label holds no answer", name, label, got, err)
			}
		}
		for _, c := range []struct {
			pred, label string
			em, f1      float64
		}{
			{"Paris", "Paris", 1, 1},
			{"the city of Paris", "Paris", 0, 0.5},
			{"", "Paris", 0, 0},
			{"Lyon", `["Paris", "Lutetia"]`, 0, 0},
		} {
			want := map[string]float64{"em": c.em, "f1": c.f1}[name]
			if got, err := fn(context.Background(), "q", c.pred, c.label); err != nil || math.Abs(got-want) > 1e-9 {
				t.Errorf("%s(%q, %q) = %v, %v; want %v", name, c.pred, c.label, got, err, want)
			}
		}
	}
	if _, ok := Builtin("contains"); ok {
		t.Error("Builtin found a reward that is not built in")
	}
}

// TestNoAnswerIsNeverRight: an episode that ended without an answer (out of
// turns, say) is scored on "". A multiple-choice label "A" normalizes to
// nothing (the article is dropped), and so did "": the missing answer was
// an exact match, and F1 1. An answer that normalization empties keeps its
// articles; no answer scores 0 against any label, and a label of
// punctuation alone holds no answer to compare with.
func TestNoAnswerIsNeverRight(t *testing.T) {
	for _, c := range []struct {
		pred, label string
		want        float64
	}{
		{"", "A", 0},
		{"  ", "A|B", 0},
		{"the", "A", 0},
		{"?", "A", 0},
		{"B", "A", 0},
		{"A", "A", 1},
		{"a.", "A", 1},
		{"(B)", "A|B", 1},
		{"", "The", 0},
		{"The The", "the the", 1},
		{"Paris", "Paris", 1},
		{"", "?", 0},
	} {
		if got := ExactMatch(c.pred, c.label); got != c.want {
			t.Errorf("ExactMatch(%q, %q) = %v, want %v", c.pred, c.label, got, c.want)
		}
		if got := F1(c.pred, c.label); got != c.want {
			t.Errorf("F1(%q, %q) = %v, want %v", c.pred, c.label, got, c.want)
		}
	}
	for _, name := range []string{"em", "f1"} {
		fn, _ := Builtin(name)
		if got, err := fn(context.Background(), "q", "", "A"); err != nil || got != 0 {
			t.Errorf("%s of no answer against label A: %v, %v; want 0", name, got, err)
		}
		if got, err := fn(context.Background(), "q", "?", "?|!"); err == nil || fail.KindOf(err) != fail.Invalid || !strings.Contains(err.Error(), "holds no answer") {
			t.Errorf("%s with label %q: %v, %v; want an invalid-input error saying the label holds no answer", name, "?|!", got, err)
		}
	}
}

// TestRemoteRedirects: a reward server that redirects had its request
// followed anywhere: to another host, which was sent the prompt and the
// label and whose answer became the score, and, on a 302, as a GET
// without the body, whose answer was no score of the episode. Only a
// redirect that keeps the POST (307, 308) to the same scheme and host is
// followed; any other is a permanent error naming where it pointed.
func TestRemoteRedirects(t *testing.T) {
	var away atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		away.Add(1)
		w.Write([]byte("1"))
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/away":
			http.Redirect(w, r, other.URL+"/score", http.StatusTemporaryRedirect)
		case r.URL.Path == "/get":
			http.Redirect(w, r, "/score", http.StatusFound)
		case r.URL.Path == "/moved":
			http.Redirect(w, r, "/score", http.StatusPermanentRedirect)
		case r.Method != http.MethodPost:
			w.Write([]byte("1")) // a page for a GET, not a score
		default:
			var req map[string]string
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req["label"] != "Paris" {
				http.Error(w, "no request", http.StatusBadRequest)
				return
			}
			w.Write([]byte("0.25"))
		}
	}))
	defer srv.Close()
	for _, path := range []string{"/away", "/get"} {
		got, err := Remote{URL: srv.URL + path}.Score(context.Background(), "q", "Lyon", "Paris")
		if err == nil || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), "/score") {
			t.Errorf("%s: reward %v, error %v; want a permanent error naming where the server redirected", path, got, err)
		}
	}
	if n := away.Load(); n != 0 {
		t.Errorf("the other host was asked %d times", n)
	}
	if got, err := (Remote{URL: srv.URL + "/moved", HTTP: &http.Client{}}).Score(context.Background(), "q", "Lyon", "Paris"); err != nil || got != 0.25 {
		t.Errorf("a 308 to the same host: %v, %v; want 0.25", got, err)
	}
}
