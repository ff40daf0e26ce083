package plan

import (
	"errors"
	"testing"
)

// The nodes of the JSON plans below.
const (
	jsonA  = `{"id":"T1","tool":"search","args":{"query":"a"}}`
	jsonA2 = "{\n  \"id\": \"T1\",\n  \"args\": {\"query\": \"a\"},\n  \"tool\": \"search\"\n}"
	jsonB  = `{"id":"T1","tool":"search","args":{"query":"b"}}`
)

// TestJSONOnePlan: the output holds one JSON plan. A second node list, in
// the plan's own object or in another value before or after it, is a
// syntax error naming both, as a second <graph> is, unless it holds the
// same nodes (layout aside); a list without nodes is a mention.
func TestJSONOnePlan(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"nodes":[` + jsonA + `],"nodes":[` + jsonB + `]}`,
			`the output holds two different plans, the "nodes" list at line 1 and the second "nodes" list at line 1; write one JSON plan with the whole plan`},
		{"{\"plan\": {\"nodes\": [" + jsonA + "]},\n\"steps\": [" + jsonB + "]}",
			`the output holds two different plans, the "nodes" list at line 1 and the "steps" list at line 2; write one JSON plan with the whole plan`},
		{`{"nodes":[` + jsonA + "]}\nOr better:\n" + `{"nodes":[` + jsonB + `]}`,
			"the output holds two different plans, the JSON plan at line 1 and the JSON plan at line 3; write one JSON plan with the whole plan"},
		{`{"nodes":[` + jsonA + "]}\n\n[" + jsonB + "]",
			"the output holds two different plans, the JSON plan at line 1 and the JSON plan at line 3; write one JSON plan with the whole plan"},
		// The fenced plan is read first; a draft before it is a plan too.
		{"Draft: {\"nodes\":[" + jsonB + "]}\n```json\n{\"nodes\":[" + jsonA + "]}\n```",
			"the output holds two different plans, the JSON plan at line 1 and the JSON plan at line 3; write one JSON plan with the whole plan"},
		// A second plan cut off, or not valid JSON, is not the same plan.
		{`{"nodes":[` + jsonA + "]}\n" + `{"nodes":[{"id":"T1","tool":"sea`,
			"the output holds two different plans, the JSON plan at line 1 and the JSON plan at line 2; write one JSON plan with the whole plan"},
		{`{"nodes":[` + jsonA + "]}\n" + `{"nodes":[` + jsonA + `,,]}`,
			"the output holds two different plans, the JSON plan at line 1 and the JSON plan at line 2; write one JSON plan with the whole plan"},
		{`{"nodes":[` + jsonB + ",,]}\n" + `{"nodes":[` + jsonA + `]}`,
			"the output holds two different plans, the JSON plan at line 1 and the JSON plan at line 2; write one JSON plan with the whole plan"},
		{`{"nodes":[` + jsonA + `],"steps":[` + jsonA + `,` + jsonB + `]}`,
			`the output holds two different plans, the "nodes" list at line 1 and the "steps" list at line 1; write one JSON plan with the whole plan`},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search"}})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Message != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want a syntax error: %s", c.in, r.Plan, err, c.want)
		}
	}
	for _, in := range []string{
		`{"nodes":[` + jsonA + `],"nodes":[` + jsonA2 + `]}`,
		`{"nodes":[` + jsonA + "]}\nOnce more:\n```json\n{\"steps\": [" + jsonA2 + "]}\n```",
		"Draft: {\"nodes\":[" + jsonA + "]}\n```json\n{\"nodes\":[" + jsonA2 + "]}\n```",
		`{"nodes":[` + jsonA + "]}\nAn empty plan is written {\"nodes\": []}.",
		"<think>{\"nodes\":[" + jsonB + "]}</think>\n{\"nodes\":[" + jsonA + "]}",
		`{"nodes":[` + jsonA + "]}\n<observation>{\"nodes\":[" + jsonB + "]}</observation>",
		`{"nodes":[` + jsonA + `], "edges": [{"from": "T1", "to": "T1"}]}` + "\n" + `{"note": {"id": "x"}}`,
	} {
		r, err := Parse(in, Options{Tools: []string{"search"}})
		if err != nil || planString(r.Plan) != "T1 search(a) <- " {
			t.Errorf("Parse(%q) = %+v, %v; want the plan of T1", in, r.Plan, err)
		}
	}
}

// TestStreamedJSONSecondPlanHolds: once what may be a second plan has
// begun (a value that may still hold a node list, or a node list after the
// plan's), a streamed JSON plan releases nothing until the rest says
// whether it is the same plan; the plan itself is released as it streams.
func TestStreamedJSONSecondPlanHolds(t *testing.T) {
	opts := Options{Tools: []string{"search"}, DefaultTool: waiting, Partial: true}
	for _, c := range []struct{ first, held string }{
		{`{"nodes":[` + jsonA + "]}\n", `{"nodes":[` + jsonB + `]`},
		{`{"nodes":[` + jsonA + "]}\n", `{"nodes":[` + jsonA},
		{`{"nodes":[` + jsonA + `], "nodes":`, `[` + jsonB},
		{`{"nodes":[` + jsonA + "]}\n", `{"note": "first", "steps": [` + jsonB + `]`},
	} {
		r, err := Parse(c.first, opts)
		if err != nil || planString(r.Plan) != "T1 search(a) <- " {
			t.Errorf("Parse(%q) = %+v, %v; want T1 released", c.first, r.Plan, err)
		}
		for end := 1; end <= len(c.held); end++ {
			in := c.first + c.held[:end]
			if r, err := Parse(in, opts); err == nil {
				t.Errorf("Parse(%q) = %s; want the plan held while the second value streams", in, planString(r.Plan))
				break
			}
		}
	}
}
