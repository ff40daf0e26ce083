package telemetry_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	_ "github.com/planact/planact/pkg/telemetry" // registers planact's metrics
)

const dashboardFile = "../../compose/grafana/planact-dashboard.json"

// panel is what the test reads of a Grafana panel (rows nest theirs).
type panel struct {
	Title      string `json:"title"`
	Type       string `json:"type"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// TestDashboardQueriesNameRegisteredMetrics: every planact_ metric a query
// of the Grafana dashboard names is registered in the process's Prometheus
// registry, so a renamed or misspelt metric fails here rather than leaving
// an empty panel in front of an operator.
func TestDashboardQueriesNameRegisteredMetrics(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	exprs := map[string]string{} // expr -> panel title
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || (p.Datasource.UID != "${DS_PROMETHEUS}" && p.Datasource.UID != "prometheus") {
				t.Errorf("panel %q: datasource %+v, want the uid ${DS_PROMETHEUS} or prometheus", p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				exprs[q.Expr] = p.Title
			}
		}
	}
	walk(d.Panels)
	used := map[string]bool{}
	for expr, title := range exprs {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("panel %q: query %q names no planact metric", title, expr)
		}
		for _, name := range names {
			used[name] = true
			if !registeredName(name) {
				t.Errorf("panel %q: query %q names %s, which planact does not register", title, expr, name)
			}
		}
	}
	// What operators asked for (issue 11) has its panel.
	for _, name := range []string{
		"planact_rollouts_finished_total", "planact_episodes_ended_total", "planact_act_seconds",
		"planact_engine_request_seconds", "planact_act_retries_total", "planact_act_failures_total",
		"planact_acts_in_flight", "planact_barrier_wait_seconds",
	} {
		if !used[name] {
			t.Errorf("no panel queries %s", name)
		}
	}
}

// TestUnknownMetricsAreCaught: the check the dashboard test relies on
// refuses a name nothing registered, and sees through histogram series.
func TestUnknownMetricsAreCaught(t *testing.T) {
	names := metricNames(`histogram_quantile(0.99, sum by (le) (rate(planact_act_seconds_bucket[5m]))) / sum(rate(planact_no_such_thing_total{consumer="planact_x"}[5m]))`)
	if !slices.Equal(names, []string{"planact_act_seconds", "planact_no_such_thing_total"}) {
		t.Fatalf("names %v", names)
	}
	if !registeredName("planact_act_seconds") {
		t.Error("planact_act_seconds (a vector never observed) is not found")
	}
	if registeredName("planact_no_such_thing_total") {
		t.Error("planact_no_such_thing_total is taken for a registered metric")
	}
}

var (
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	metricName = regexp.MustCompile(`\bplanact_[a-zA-Z0-9_]+`)
)

// metricNames lists the planact metrics expr names, in order, once each: a
// histogram's _bucket, _sum and _count series name the histogram. Label
// values (quoted) are not names.
func metricNames(expr string) []string {
	var out []string
	for _, n := range metricName.FindAllString(quoted.ReplaceAllString(expr, `""`), -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(n, suffix); ok && registeredName(base) {
				n = base
			}
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// registeredName reports whether the default registry holds a collector
// that describes a metric called name. Gather would miss a label vector
// none of whose children exist yet, so the registry is asked about the
// name itself: a probe with that name and a help string of its own is
// refused when the name is taken (by a descriptor with other labels or
// help) and accepted, then removed, when it is free.
func registeredName(name string) bool {
	probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "dashboard test probe " + name})
	if err := prometheus.DefaultRegisterer.Register(probe); err != nil {
		return true
	}
	prometheus.DefaultRegisterer.Unregister(probe)
	return false
}
