package sim

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"

	"github.com/planact/planact/pkg/reward"
)

// Country is one entity of the question world with its facts.
type Country struct {
	Name        string
	Aliases     []string // other accepted names, for labels and lookups
	Capital     string
	Population  string // of the capital, e.g. "2.1 million"
	Currency    string
	Continent   string
	Language    string // official language
	HeadOfState string // title, e.g. "President"
	Neighbor    string // "largest neighbor": another country of the world
}

// World is a small, fixed knowledge base for multi-hop questions. The
// simulated actor answers lookups from it and the simulated planner knows
// which lookups a question needs.
type World struct {
	countries []Country
	byName    map[string]int // normalized country name or alias -> index
	byCity    map[string]int // normalized capital -> index
}

// Task is one question with its label (accepted answers separated by "|").
type Task struct {
	Question string `json:"question" msgpack:"question"`
	Label    string `json:"label" msgpack:"label"`
	Kind     string `json:"kind,omitempty" msgpack:"kind,omitempty"` // question kind, e.g. "chain2-population"
}

var defaultCountries = []Country{
	{"France", nil, "Paris", "2.1 million", "Euro", "Europe", "French", "President", "Spain"},
	{"Germany", nil, "Berlin", "3.7 million", "Euro", "Europe", "German", "President", "France"},
	{"Spain", nil, "Madrid", "3.3 million", "Euro", "Europe", "Spanish", "King", "France"},
	{"Italy", nil, "Rome", "2.8 million", "Euro", "Europe", "Italian", "President", "France"},
	{"United Kingdom", []string{"UK", "Britain"}, "London", "8.9 million", "Pound sterling", "Europe", "English", "King", "Ireland"},
	{"Ireland", nil, "Dublin", "590 thousand", "Euro", "Europe", "Irish", "President", "United Kingdom"},
	{"Poland", nil, "Warsaw", "1.8 million", "Zloty", "Europe", "Polish", "President", "Germany"},
	{"Sweden", nil, "Stockholm", "980 thousand", "Swedish krona", "Europe", "Swedish", "King", "Norway"},
	{"Norway", nil, "Oslo", "710 thousand", "Norwegian krone", "Europe", "Norwegian", "King", "Sweden"},
	{"Russia", nil, "Moscow", "13.0 million", "Ruble", "Europe", "Russian", "President", "China"},
	{"Japan", nil, "Tokyo", "14.0 million", "Yen", "Asia", "Japanese", "Emperor", "China"},
	{"China", nil, "Beijing", "21.9 million", "Renminbi", "Asia", "Mandarin", "President", "Russia"},
	{"India", nil, "New Delhi", "250 thousand", "Indian rupee", "Asia", "Hindi", "President", "China"},
	{"Indonesia", nil, "Jakarta", "10.6 million", "Rupiah", "Asia", "Indonesian", "President", "Australia"},
	{"South Korea", []string{"Korea"}, "Seoul", "9.4 million", "Won", "Asia", "Korean", "President", "China"},
	{"Turkey", []string{"Turkiye"}, "Ankara", "5.7 million", "Turkish lira", "Asia", "Turkish", "President", "Iran"},
	{"Iran", nil, "Tehran", "9.0 million", "Rial", "Asia", "Persian", "Supreme Leader", "Turkey"},
	{"United States", []string{"USA", "United States of America"}, "Washington", "690 thousand", "US dollar", "North America", "English", "President", "Canada"},
	{"Canada", nil, "Ottawa", "1.0 million", "Canadian dollar", "North America", "English", "King", "United States"},
	{"Mexico", nil, "Mexico City", "9.2 million", "Mexican peso", "North America", "Spanish", "President", "United States"},
	{"Brazil", nil, "Brasilia", "4.8 million", "Real", "South America", "Portuguese", "President", "Argentina"},
	{"Argentina", nil, "Buenos Aires", "3.1 million", "Argentine peso", "South America", "Spanish", "President", "Brazil"},
	{"Peru", nil, "Lima", "9.7 million", "Sol", "South America", "Spanish", "President", "Brazil"},
	{"Chile", nil, "Santiago", "6.3 million", "Chilean peso", "South America", "Spanish", "President", "Argentina"},
	{"Australia", nil, "Canberra", "430 thousand", "Australian dollar", "Oceania", "English", "King", "Indonesia"},
	{"Egypt", nil, "Cairo", "10.0 million", "Egyptian pound", "Africa", "Arabic", "President", "Sudan"},
	{"Sudan", nil, "Khartoum", "2.7 million", "Sudanese pound", "Africa", "Arabic", "President", "Egypt"},
	{"Kenya", nil, "Nairobi", "4.4 million", "Kenyan shilling", "Africa", "Swahili", "President", "Ethiopia"},
	{"Ethiopia", nil, "Addis Ababa", "3.4 million", "Birr", "Africa", "Amharic", "President", "Kenya"},
}

// DefaultWorld returns the built-in world of about thirty countries.
func DefaultWorld() *World {
	w, err := NewWorld(defaultCountries)
	if err != nil {
		panic(err)
	}
	return w
}

// NewWorld builds a world; every Neighbor must name a country of the list and
// names and capitals must be unique.
func NewWorld(countries []Country) (*World, error) {
	w := &World{countries: countries, byName: map[string]int{}, byCity: map[string]int{}}
	for i, c := range countries {
		for _, n := range append([]string{c.Name}, c.Aliases...) {
			if _, dup := w.byName[reward.Normalize(n)]; dup {
				return nil, fmt.Errorf("sim: duplicate country name %q", n)
			}
			w.byName[reward.Normalize(n)] = i
		}
		if _, dup := w.byCity[reward.Normalize(c.Capital)]; dup {
			return nil, fmt.Errorf("sim: duplicate capital %q", c.Capital)
		}
		w.byCity[reward.Normalize(c.Capital)] = i
	}
	for _, c := range countries {
		if _, ok := w.byName[reward.Normalize(c.Neighbor)]; !ok {
			return nil, fmt.Errorf("sim: %s: unknown neighbor %q", c.Name, c.Neighbor)
		}
	}
	return w, nil
}

// Countries returns the world's countries.
func (w *World) Countries() []Country { return w.countries }

// relation is a kind of lookup: "<name> of <entity>".
type relation struct {
	names  []string // normalized query prefixes, e.g. "capital of"
	ofCity bool     // the entity is a capital city, not a country
	get    func(w *World, c *Country) string
}

var relations = []relation{
	{names: []string{"capital of", "capital city of"}, get: func(_ *World, c *Country) string { return c.Capital }},
	{names: []string{"population of"}, ofCity: true, get: func(_ *World, c *Country) string { return c.Population }},
	{names: []string{"currency of", "currency used in", "currency in"}, get: func(_ *World, c *Country) string { return c.Currency }},
	{names: []string{"continent of"}, get: func(_ *World, c *Country) string { return c.Continent }},
	{names: []string{"official language of", "language of"}, get: func(_ *World, c *Country) string { return c.Language }},
	{names: []string{"head of state of"}, get: func(_ *World, c *Country) string { return c.HeadOfState }},
	{names: []string{"largest neighbor of", "largest neighbour of", "neighbor of"}, get: func(w *World, c *Country) string { return c.Neighbor }},
	{names: []string{"country whose capital is", "country with capital", "country with capital city", "country of"}, ofCity: true,
		get: func(_ *World, c *Country) string { return c.Name }},
}

var queryPrefixes = []string{"what is ", "whats ", "what s ", "find ", "look up ", "lookup "}

// resolve finds the relation and entity a lookup query asks about.
func (w *World) resolve(query string) (rel int, country int, ok bool) {
	q := normQuery(query)
	for _, p := range queryPrefixes {
		q = strings.TrimPrefix(q, p)
	}
	for ri, r := range relations {
		for _, name := range r.names {
			ent, found := strings.CutPrefix(q, name+" ")
			if !found {
				continue
			}
			idx := w.byName
			if r.ofCity {
				idx = w.byCity
			}
			if ci, ok := idx[ent]; ok {
				return ri, ci, true
			}
		}
	}
	return 0, 0, false
}

// Lookup answers a sub-question such as "capital of France" -> "Paris" or
// "population of Paris" -> "2.1 million", ignoring case, punctuation,
// articles and fault markers.
func (w *World) Lookup(query string) (string, bool) {
	ri, ci, ok := w.resolve(query)
	if !ok {
		return "", false
	}
	return relations[ri].get(w, &w.countries[ci]), true
}

// wrongLookup answers a lookup wrongly but plausibly: the same relation of
// another country, picked by h.
func (w *World) wrongLookup(query string, h uint64) string {
	ri, ci, ok := w.resolve(query)
	if !ok {
		return "unknown"
	}
	right := relations[ri].get(w, &w.countries[ci])
	n := len(w.countries)
	for k := range n {
		j := int((h + uint64(k)) % uint64(n))
		if v := relations[ri].get(w, &w.countries[j]); j != ci && reward.Normalize(v) != reward.Normalize(right) {
			return v
		}
	}
	return "unknown"
}

// aliases returns the accepted spellings of an answer (a country name or
// capital gets its aliases), joined into a label.
func (w *World) label(answer string) string {
	if ci, ok := w.byName[reward.Normalize(answer)]; ok {
		c := w.countries[ci]
		return strings.Join(append([]string{c.Name}, c.Aliases...), "|")
	}
	if answer == "Washington" {
		return "Washington|Washington, D.C."
	}
	return answer
}

// questionKind is a template of a multi-hop question and the lookups it needs.
type questionKind struct {
	name     string
	template string   // with %s for the entities
	steps    []string // lookups; %s = entity, {k} = output of step k
	cityArg  bool     // the entity is a capital, not a country
	compare  string   // "larger" or "smaller" for comparisons
	re       *regexp.Regexp
}

// Kinds, most specific first so that parsing a question picks the right one.
var questionKinds = []*questionKind{
	{name: "chain3-population", template: "What is the population of the capital of the largest neighbor of %s?",
		steps: []string{"largest neighbor of %s", "capital of {0}", "population of {1}"}},
	{name: "chain3-currency", template: "What currency is used in the largest neighbor of the country whose capital is %s?",
		steps: []string{"country whose capital is %s", "largest neighbor of {0}", "currency of {1}"}, cityArg: true},
	{name: "chain2-population", template: "What is the population of the capital of %s?",
		steps: []string{"capital of %s", "population of {0}"}},
	{name: "chain2-currency", template: "What currency is used in the largest neighbor of %s?",
		steps: []string{"largest neighbor of %s", "currency of {0}"}},
	{name: "chain2-continent", template: "On which continent is the country whose capital is %s?",
		steps: []string{"country whose capital is %s", "continent of {0}"}, cityArg: true},
	{name: "chain2-language", template: "What is the official language of the largest neighbor of %s?",
		steps: []string{"largest neighbor of %s", "official language of {0}"}},
	{name: "compare-larger", template: "Which capital has the larger population, the capital of %s or the capital of %s?",
		steps: []string{"capital of %s", "capital of %s", "population of {0}", "population of {1}"}, compare: "larger"},
	{name: "compare-smaller", template: "Which capital has the smaller population, the capital of %s or the capital of %s?",
		steps: []string{"capital of %s", "capital of %s", "population of {0}", "population of {1}"}, compare: "smaller"},
}

func init() {
	for _, k := range questionKinds {
		pat := regexp.QuoteMeta(strings.TrimSuffix(k.template, "?"))
		pat = strings.ReplaceAll(pat, "%s", "(.+?)")
		k.re = regexp.MustCompile(`(?i)^\s*` + pat + `\s*\??\s*$`)
	}
}

// questionPlan is what the simulated planner knows about a question.
type questionPlan struct {
	kind  *questionKind
	steps []string // lookups with {k} placeholders for earlier steps
}

// parseQuestion recognizes a question of the world (fault markers removed).
func parseQuestion(q string) (questionPlan, bool) {
	q = strings.TrimSpace(stripMarkers(q))
	for _, k := range questionKinds {
		m := k.re.FindStringSubmatch(q)
		if m == nil {
			continue
		}
		args := m[1:]
		steps := make([]string, len(k.steps))
		ai := 0
		for i, s := range k.steps {
			if strings.Contains(s, "%s") {
				s = strings.Replace(s, "%s", strings.TrimSpace(args[ai]), 1)
				ai++
			}
			steps[i] = s
		}
		return questionPlan{kind: k, steps: steps}, true
	}
	return questionPlan{}, false
}

// answer derives the final answer from the outputs of all steps.
func (p questionPlan) answer(outs []string) string {
	if p.kind.compare == "" {
		return outs[len(outs)-1]
	}
	a, okA := parsePopulation(outs[2])
	b, okB := parsePopulation(outs[3])
	if !okA || !okB {
		return "unknown"
	}
	if (a > b) == (p.kind.compare == "larger") {
		return outs[0]
	}
	return outs[1]
}

var popRe = regexp.MustCompile(`(?i)([0-9][0-9,]*(?:\.[0-9]+)?)\s*(million|thousand|billion)?`)

// parsePopulation reads "2.1 million", "430 thousand" or "690,000".
func parsePopulation(s string) (float64, bool) {
	m := popRe.FindStringSubmatch(s)
	if m == nil {
		return 0, false
	}
	x, err := strconv.ParseFloat(strings.ReplaceAll(m[1], ",", ""), 64)
	if err != nil {
		return 0, false
	}
	switch strings.ToLower(m[2]) {
	case "thousand":
		x *= 1e3
	case "million":
		x *= 1e6
	case "billion":
		x *= 1e9
	}
	return x, true
}

// truth answers a question from the world itself.
func (w *World) truth(p questionPlan) (string, bool) {
	outs := make([]string, len(p.steps))
	for i := range p.steps {
		v, ok := w.Lookup(fill(p.steps[i], outs, func(k int) string { return outs[k] }))
		if !ok {
			return "", false
		}
		outs[i] = v
	}
	return p.answer(outs), true
}

// fill replaces the {k} placeholders of a step.
func fill(step string, _ []string, value func(k int) string) string {
	return placeholderRe.ReplaceAllStringFunc(step, func(m string) string {
		k, _ := strconv.Atoi(m[1 : len(m)-1])
		return value(k)
	})
}

var placeholderRe = regexp.MustCompile(`\{[0-9]+\}`)

// refs lists the steps a step depends on.
func refs(step string) []int {
	var out []int
	for _, m := range placeholderRe.FindAllString(step, -1) {
		k, _ := strconv.Atoi(m[1 : len(m)-1])
		out = append(out, k)
	}
	return out
}

// Tasks returns n questions, deterministic for a seed, cycling through every
// question kind (2-hop chains, 3-hop chains and parallel comparisons).
func (w *World) Tasks(n int, seed int64) []Task {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed_0f_7a5c))
	out := make([]Task, 0, n)
	for i := 0; len(out) < n; i++ {
		k := questionKinds[i%len(questionKinds)]
		a := &w.countries[rng.IntN(len(w.countries))]
		var q string
		switch {
		case k.compare != "":
			b := &w.countries[rng.IntN(len(w.countries))]
			pa, _ := parsePopulation(a.Population)
			pb, _ := parsePopulation(b.Population)
			if a == b || pa == pb {
				continue
			}
			q = fmt.Sprintf(k.template, a.Name, b.Name)
		case k.cityArg:
			q = fmt.Sprintf(k.template, a.Capital)
		default:
			q = fmt.Sprintf(k.template, a.Name)
		}
		p, ok := parseQuestion(q)
		if !ok {
			panic("sim: cannot parse generated question " + q)
		}
		ans, ok := w.truth(p)
		if !ok {
			panic("sim: cannot answer generated question " + q)
		}
		out = append(out, Task{Question: q, Label: w.label(ans), Kind: k.name})
	}
	return out
}

// Answer returns the true answer of a question of this world, if it is one.
func (w *World) Answer(question string) (string, bool) {
	p, ok := parseQuestion(question)
	if !ok {
		return "", false
	}
	return w.truth(p)
}
