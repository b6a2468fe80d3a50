package main

// The dashboard and the alerts, tested against the real thing: Prometheus
// scrapes a router in front of simulated replicas under load (and the
// replicas themselves), loads the alerting rules, and every dashboard
// query and every alert's value expression must return data — a typo'd
// metric or a wrong label returns nothing and fails here. promtool checks
// the rules' unit tests and lints both /metrics pages.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
	"go.yaml.in/yaml/v3"
)

const (
	dashboardPath = "../../configs/grafana/gpurouter.json"
	rulesPath     = "../../configs/prometheus/gpurouter.rules.yml"
	rulesTestPath = "../../configs/prometheus/gpurouter.rules.test.yml"
	promExample   = "../../configs/prometheus/prometheus.example.yml"
)

// dashboard is the part of Grafana's dashboard JSON the tests read.
type dashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name, Type string
			Query      any `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashPanel `json:"panels"`
}

type dashPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type, UID string
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// Grafana's side of the contract, checked without Grafana: the data source
// is a variable, the pool (model), replica and arm variables exist, every
// panel reads through the variable, and panel ids are unique.
func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	for name, typ := range map[string]string{"datasource": "datasource", "model": "query", "replica": "query", "arm": "query"} {
		if vars[name] != typ {
			t.Errorf("template variable %q: type %q, want %q", name, vars[name], typ)
		}
	}
	ids := map[int]bool{}
	queries := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not read through the datasource variable: %+v", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			if strings.TrimSpace(q.Expr) == "" {
				t.Errorf("panel %q query %s is empty", p.Title, q.RefID)
			}
		}
	}
	if queries < 40 {
		t.Errorf("%d queries: the dashboard lost panels", queries)
	}
}

// dashboardVars are the template variables' values, formatted as Grafana
// formats a multi-value selection for a regex matcher. Concrete values,
// not "All" (.*): a matcher on a misspelt label matches every series with
// .*, and nothing with a value.
type dashboardVars struct{ model, replicas, arms []string }

// expr makes a panel query runnable outside Grafana: the variables take
// their values and the rate window spans the test.
func (v dashboardVars) expr(expr string) string {
	multi := func(vals []string) string { return "(" + strings.Join(vals, "|") + ")" }
	return strings.NewReplacer("$__rate_interval", "1m", "$model", multi(v.model), "$replica", multi(v.replicas),
		"$arm", multi(v.arms)).Replace(expr)
}

// labelValuesQuery is the form of the dashboard's variable queries.
var labelValuesQuery = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]+)\)$`)

// variableValues runs a template variable's label_values query as Grafana
// does, through /api/v1/label/NAME/values, and returns the values sorted.
func (p *prometheusServer) variableValues(t *testing.T, query any, vars dashboardVars) []string {
	t.Helper()
	q, _ := query.(map[string]any)
	text, _ := q["query"].(string)
	m := labelValuesQuery.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("variable query %v: want label_values(SELECTOR, LABEL)", query)
	}
	resp, err := http.Get(p.url + "/api/v1/label/" + m[2] + "/values?" + url.Values{"match[]": {vars.expr(m[1])}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Data []string `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	return sorted(doc.Data)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// promRule is one rule as Prometheus' /api/v1/rules reports it.
type promRule struct {
	Name      string `json:"name"`
	Query     string `json:"query"`
	Type      string `json:"type"` // alerting or recording
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

func (p *prometheusServer) rules(t *testing.T) []promRule {
	t.Helper()
	resp, err := http.Get(p.url + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Data struct {
			Groups []struct {
				Rules []promRule `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	var out []promRule
	for _, g := range doc.Data.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// ruleCount is the number of rules in the rules file.
func ruleCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []map[string]any `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range doc.Groups {
		n += len(g.Rules)
	}
	return n
}

// empty says why expr returns nothing: the query's error, or each of its
// selectors that has no series (the typo'd metric or the wrong label).
func (p *prometheusServer) empty(expr string) string {
	res, err := p.query(expr)
	switch {
	case err != nil:
		return "refused: " + err.Error()
	case len(res) > 0:
		return ""
	}
	var missing []string
	for _, sel := range promSelectors(expr) {
		if r, err := p.query("count(" + sel + ")"); err != nil || len(r) == 0 {
			missing = append(missing, sel)
		}
	}
	if len(missing) == 0 {
		return "no data (every selector has series: the join or the arithmetic drops them)"
	}
	return "no data; no series for " + strings.Join(missing, ", ")
}

func TestDashboardAndAlertsAgainstPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Prometheus against a router and simulated replicas under load")
	}
	promBin := needBinary(t, "prometheus", "prometheus")
	// Replica 2 fails a fifth of its requests with 503 before answering:
	// the router retries them elsewhere, so the retry panels have data.
	of := startObservedFleet(t, 3, []sim.Faults{{}, {}, {ErrorRate: 0.2, ErrorStatus: 503}}, "")
	of.load(t, 30)
	prom := startPrometheus(t, promBin, map[string][]string{
		"gpurouter": {strings.TrimPrefix(of.router, "http://")},
		"vllm":      of.engines,
	}, []string{rulesPath})

	type check struct{ where, expr string }
	var checks []check
	d := loadDashboard(t)
	vars := dashboardVars{model: []string{"m"}, replicas: of.names, arms: []string{"least-loaded", "round-robin"}}
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			checks = append(checks, check{fmt.Sprintf("panel %q query %s", p.Title, q.RefID), vars.expr(q.Expr)})
		}
	}
	// The variables' own queries offer exactly the fleet's pool, replicas
	// and arms: the values the panel queries were run with.
	want := map[string][]string{"model": vars.model, "replica": vars.replicas, "arm": vars.arms}
	var mismatch string
	waitUntil(t, 30*time.Second, "template variables list the fleet", func() bool {
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			if got := prom.variableValues(t, v.Query, vars); !slices.Equal(got, sorted(want[v.Name])) {
				mismatch = fmt.Sprintf("variable %s offers %q, want %q", v.Name, got, sorted(want[v.Name]))
				return false
			}
		}
		return true
	}, &mismatch)

	// The rules as Prometheus loaded them: all of them, each evaluated
	// without error. Recording rules must produce series; alerts' value
	// expressions (each threshold's left side) must return data while the
	// alerts are silent.
	nRules := ruleCount(t)
	var rules []promRule
	waitUntil(t, 30*time.Second, "rules loaded and evaluated", func() bool {
		rules = prom.rules(t)
		for _, r := range rules {
			if r.Health != "ok" {
				return false
			}
		}
		return len(rules) == nRules
	})
	for _, r := range rules {
		if r.Type == "recording" {
			// Its expression rather than its name, so that a failure names
			// the selector or the join that comes up empty.
			checks = append(checks, check{"recording rule " + r.Name, r.Query})
			continue
		}
		for i, v := range alertValues(r.Query) {
			checks = append(checks, check{fmt.Sprintf("alert %s value %d", r.Name, i+1), v})
		}
	}

	// Retries, the engines' histograms and rates over a window need a few
	// scrapes under load: poll (bounded) until every check has data.
	var failing []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		failing = failing[:0]
		for _, c := range checks {
			if why := prom.empty(c.expr); why != "" {
				failing = append(failing, fmt.Sprintf("%s: %s\n    %s", c.where, why, c.expr))
			}
		}
		if len(failing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if len(failing) > 0 {
		t.Errorf("%d of %d queries return no data:\n%s", len(failing), len(checks), strings.Join(failing, "\n"))
	} else {
		t.Logf("all %d dashboard queries and rule expressions return data", len(checks))
	}
	for _, r := range prom.rules(t) {
		if r.Health != "ok" {
			t.Errorf("rule %s: health %s: %s", r.Name, r.Health, r.LastError)
		}
	}
}

// The rules' unit tests (a firing and a silent case per alert) pass, and
// the example Prometheus configuration loads with them.
func TestAlertRulesUnitTests(t *testing.T) {
	promtool := needBinary(t, "promtool", "prometheus")
	out, errOut, err := runBounded(t, time.Minute, nil, promtool, "test", "rules", rulesTestPath)
	if err != nil || !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: %v\n%s%s", err, out, errOut)
	}
	out, errOut, err = runBounded(t, time.Minute, nil, promtool, "check", "config", promExample)
	if err != nil {
		t.Errorf("promtool check config: %v\n%s%s", err, out, errOut)
	}
	// Every alert has a test case that names it.
	tests, err := os.ReadFile(rulesTestPath)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(rules), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "- alert: "); ok {
			if n := strings.Count(string(tests), "alertname: "+name+"\n"); n < 2 {
				t.Errorf("alert %s has %d test cases, want a firing and a silent one", name, n)
			}
		}
	}
}

// promtool's linter finds nothing wrong with the router's /metrics or the
// simulator's, vLLM's own names aside (vLLM chose "vllm:" names, which
// the linter flags for their colon; the simulator copies them).
func TestMetricsPassPromtoolLint(t *testing.T) {
	promtool := needBinary(t, "promtool", "prometheus")
	of := startObservedFleet(t, 2, nil, "")
	for i := range 4 {
		resp, err := http.Post(of.router+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"lint `+fmt.Sprint(i)+`"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
	}
	waitUntil(t, 10*time.Second, "GPU telemetry in the router's /metrics", func() bool {
		return strings.Contains(fetch(t, of.router+"/metrics"), "gpurouter_replica_gpu_utilization_ratio")
	})
	for _, target := range []string{of.router, "http://" + of.engines[0]} {
		page := fetch(t, target+"/metrics")
		out, errOut, err := runBounded(t, time.Minute, strings.NewReader(page), promtool, "check", "metrics")
		var problems []string
		for _, line := range strings.Split(strings.TrimSpace(out+"\n"+errOut), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "vllm:") {
				problems = append(problems, line)
			}
		}
		if len(problems) > 0 {
			t.Errorf("promtool check metrics %s/metrics (%v):\n%s", target, err, strings.Join(problems, "\n"))
		}
	}
}

func fetch(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
