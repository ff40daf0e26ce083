package telemetry_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const observabilityDoc = "../../docs/observability.md"

// declaredMetrics reads metrics.go: each planact metric's name and label
// names, as its promauto constructor declares them.
func declaredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "metrics.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.X.(*ast.Ident).Name != "promauto" {
			return true
		}
		opts, ok := call.Args[0].(*ast.CompositeLit)
		if !ok {
			return true
		}
		name := ""
		for _, e := range opts.Elts {
			if kv, ok := e.(*ast.KeyValueExpr); ok && kv.Key.(*ast.Ident).Name == "Name" {
				name, _ = strconv.Unquote(kv.Value.(*ast.BasicLit).Value)
			}
		}
		labels := []string{}
		if len(call.Args) > 1 {
			for _, e := range call.Args[1].(*ast.CompositeLit).Elts {
				l, _ := strconv.Unquote(e.(*ast.BasicLit).Value)
				labels = append(labels, l)
			}
		}
		out[name] = labels
		return true
	})
	if len(out) == 0 {
		t.Fatal("metrics.go declares no metric: the test reads it wrong")
	}
	return out
}

var docMetric = regexp.MustCompile("`(planact_[a-z0-9_]+)(\\{[^}`]*\\})?`")

// TestTheDocNamesEveryMetricAsRegistered: docs/observability.md is where an
// operator looks up a metric. Every metric planact registers is named
// there, every name there is registered, and labels written with a name
// (`planact_x{role,limit}`) are the metric's own. The table left out
// planact_stream_refusals_total (what says a stream is full) and named the
// handled-message metrics only in words.
func TestTheDocNamesEveryMetricAsRegistered(t *testing.T) {
	data, err := os.ReadFile(observabilityDoc)
	if err != nil {
		t.Fatal(err)
	}
	declared := declaredMetrics(t)
	named := map[string]bool{}
	for _, m := range docMetric.FindAllStringSubmatch(string(data), -1) {
		name, labels := m[1], m[2]
		named[name] = true
		want, ok := declared[name]
		if !ok {
			t.Errorf("the doc names %s, which planact does not register", name)
			continue
		}
		if labels == "" {
			continue
		}
		var got []string
		for _, l := range strings.Split(strings.Trim(labels, "{}"), ",") {
			got = append(got, strings.TrimSpace(l))
		}
		if !slices.Equal(got, want) {
			t.Errorf("the doc writes %s%s; the metric's labels are %v", name, labels, want)
		}
	}
	for name := range declared {
		if !named[name] {
			t.Errorf("%s is registered but the doc does not name it", name)
		}
	}
}
