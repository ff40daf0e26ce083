package sim

import (
	"reflect"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/reward"
)

func TestTokenizerRoundTrip(t *testing.T) {
	for _, s := range []string{"", "Paris", "<graph>\n</graph>", "héllo ✓"} {
		ids := Encode(s)
		for _, id := range ids {
			if id < ByteOffset || id >= VocabSize {
				t.Fatalf("Encode(%q) has id %d", s, id)
			}
		}
		got, err := Decode(append(append([]int{BOSID}, ids...), EOSID))
		if err != nil || got != s {
			t.Errorf("Decode(Encode(%q)) = %q, %v", s, got, err)
		}
	}
	if _, err := Decode([]int{VocabSize}); err == nil {
		t.Error("Decode accepted an id out of vocabulary")
	}
}

func TestLookup(t *testing.T) {
	w := DefaultWorld()
	for _, tc := range []struct {
		query, want string
		ok          bool
	}{
		{"capital of France", "Paris", true},
		{"Capital of france?", "Paris", true},
		{"What is the capital of the United States?", "Washington", true},
		{"capital of USA", "Washington", true},
		{"population of Paris", "2.1 million", true},
		{"population of New Delhi.", "250 thousand", true},
		{"currency of Japan", "Yen", true},
		{"currency used in Germany", "Euro", true},
		{"continent of Kenya", "Africa", true},
		{"official language of Brazil", "Portuguese", true},
		{"language of Iran", "Persian", true},
		{"head of state of Japan", "Emperor", true},
		{"largest neighbor of Germany", "France", true},
		{"largest neighbour of Germany", "France", true},
		{"country whose capital is Tokyo", "Japan", true},
		{"the country with capital Mexico City", "Mexico", true},
		{"capital of France #fault:actor-wrong", "Paris", true},
		{`"capital of France"`, "Paris", true},
		{"population of France", "", false},
		{"capital of Atlantis", "", false},
		{"weather in Paris", "", false},
		{"", "", false},
	} {
		got, ok := w.Lookup(tc.query)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Lookup(%q) = %q, %v; want %q, %v", tc.query, got, ok, tc.want, tc.ok)
		}
	}
}

func TestWrongLookup(t *testing.T) {
	w := DefaultWorld()
	for _, q := range []string{"capital of France", "population of Paris", "largest neighbor of Spain", "country whose capital is Rome"} {
		right, _ := w.Lookup(q)
		for h := range uint64(40) {
			if wrong := w.wrongLookup(q, h); wrong == right || wrong == "unknown" {
				t.Fatalf("wrongLookup(%q, %d) = %q", q, h, wrong)
			}
		}
	}
}

func TestTasks(t *testing.T) {
	w := DefaultWorld()
	tasks := w.Tasks(64, 7)
	if len(tasks) != 64 {
		t.Fatalf("got %d tasks", len(tasks))
	}
	if !reflect.DeepEqual(tasks, w.Tasks(64, 7)) {
		t.Error("Tasks is not deterministic")
	}
	if reflect.DeepEqual(tasks, w.Tasks(64, 8)) {
		t.Error("Tasks ignores the seed")
	}
	kinds := map[string]int{}
	for _, task := range tasks {
		kinds[task.Kind]++
		ans, ok := w.Answer(task.Question)
		if !ok {
			t.Errorf("cannot answer %q", task.Question)
			continue
		}
		if reward.ExactMatch(ans, task.Label) != 1 {
			t.Errorf("%q: answer %q does not match label %q", task.Question, ans, task.Label)
		}
	}
	if len(kinds) != len(questionKinds) {
		t.Errorf("kinds = %v, want all %d", kinds, len(questionKinds))
	}
}

func TestAnswer(t *testing.T) {
	w := DefaultWorld()
	for _, tc := range []struct{ q, want string }{
		{"What is the population of the capital of France?", "2.1 million"},
		{"what is the population of the capital of japan", "14.0 million"},
		{"What is the population of the capital of the largest neighbor of Germany?", "2.1 million"},
		{"What currency is used in the largest neighbor of the country whose capital is Ottawa?", "US dollar"},
		{"On which continent is the country whose capital is Lima?", "South America"},
		{"Which capital has the larger population, the capital of France or the capital of Japan?", "Tokyo"},
		{"Which capital has the smaller population, the capital of France or the capital of Japan? #fault:actor-wrong", "Paris"},
	} {
		got, ok := w.Answer(tc.q)
		if !ok || got != tc.want {
			t.Errorf("Answer(%q) = %q, %v; want %q", tc.q, got, ok, tc.want)
		}
	}
	if _, ok := w.Answer("Who painted the Mona Lisa?"); ok {
		t.Error("answered a question outside the world")
	}
}

func TestParsePopulation(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
	}{{"2.1 million", 2.1e6}, {"430 thousand", 430e3}, {"690,000", 690000}, {"about 1.0 Million people", 1e6}} {
		if got, ok := parsePopulation(tc.in); !ok || got != tc.want {
			t.Errorf("parsePopulation(%q) = %v, %v", tc.in, got, ok)
		}
	}
	if _, ok := parsePopulation("unknown"); ok {
		t.Error("parsed unknown")
	}
}

func TestMarkers(t *testing.T) {
	ms := findMarkers("Q? #fault:actor-wrong #fault:error:2")
	if len(ms) != 2 || ms[0].kind != "actor-wrong" || ms[0].times != 0 || ms[1].kind != "error" || ms[1].times != 2 {
		t.Errorf("findMarkers = %+v", ms)
	}
	if got := stripMarkers("capital of France " + FaultTimes(FaultActorError, 1)); got != "capital of France" {
		t.Errorf("stripMarkers = %q", got)
	}
	if !strings.HasPrefix(FaultActorHang, "#fault:") {
		t.Error("marker constant")
	}
}
