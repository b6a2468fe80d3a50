package main

// Just enough PromQL reading for the operators' tests to name what is
// wrong when a dashboard query or an alert returns nothing: the series
// selectors an expression reads, and an alert's value expressions (the
// left side of each threshold). Not a parser: it knows strings, braces,
// brackets, parentheses, the label-list clauses and the set operators.

import (
	"slices"
	"strings"
	"testing"
)

// labelListWords are followed by a parenthesised list of label names, not
// by an expression.
var labelListWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promqlWords are PromQL's keywords, constants and aggregation operators
// (which may be followed by "by (...)" rather than their argument), never
// metric names here.
var promqlWords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "group": true, "stddev": true, "stdvar": true,
	"topk": true, "bottomk": true, "quantile": true, "count_values": true}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdentChar(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

// skipString returns the index just after the string literal opening at i.
func skipString(s string, i int) int {
	q := s[i]
	for i++; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case q:
			return i + 1
		}
	}
	return len(s)
}

// skipGroup returns the index just after the group (braces, brackets or
// parentheses) opening at i, strings inside included.
func skipGroup(s string, i int) int {
	open := s[i]
	closing := map[byte]byte{'{': '}', '[': ']', '(': ')'}[open]
	depth := 0
	for i < len(s) {
		switch c := s[i]; {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(s, i)
			continue
		case c == open:
			depth++
		case c == closing:
			depth--
			if depth == 0 {
				return i + 1
			}
		}
		i++
	}
	return len(s)
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t') {
		i++
	}
	return i
}

// promSelectors lists the series selectors expr reads, in order, each
// once: a metric name with its label matchers when it has some.
func promSelectors(expr string) []string {
	var out []string
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(expr, i)
		case c == '[' || c == '{':
			i = skipGroup(expr, i) // a range, or a selector without a name
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdentChar(expr[i]) || expr[i] == '.') {
				i++ // a number or a duration
			}
		case isIdentStart(c):
			start := i
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
			word := expr[start:i]
			next := skipSpace(expr, i)
			switch {
			case labelListWords[word] && next < len(expr) && expr[next] == '(':
				i = skipGroup(expr, next)
			case promqlWords[strings.ToLower(word)]:
			case next < len(expr) && expr[next] == '(':
				// a function or an aggregation
			case next < len(expr) && expr[next] == '{':
				i = skipGroup(expr, next)
				sel := word + expr[next:i]
				if !slices.Contains(out, sel) {
					out = append(out, sel)
				}
			default:
				if !slices.Contains(out, word) {
					out = append(out, word)
				}
			}
		default:
			i++
		}
	}
	return out
}

// alertValues splits an alert's expression at its top-level set operators
// (and, or, unless) and returns the left side of each part's top-level
// comparison: the values the thresholds are applied to, which must exist
// while the alert is silent too.
func alertValues(expr string) []string {
	var parts []string
	start := 0
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(expr, i)
		case c == '(' || c == '[' || c == '{':
			i = skipGroup(expr, i)
		case isIdentStart(c):
			s := i
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
			if w := expr[s:i]; w == "and" || w == "or" || w == "unless" {
				parts = append(parts, expr[start:s])
				start = i
			}
		default:
			i++
		}
	}
	parts = append(parts, expr[start:])
	var out []string
	for _, p := range parts {
		out = append(out, strings.TrimSpace(leftOfComparison(p)))
	}
	return out
}

// leftOfComparison is expr up to its first top-level comparison operator.
func leftOfComparison(expr string) string {
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(expr, i)
		case c == '(' || c == '[' || c == '{':
			i = skipGroup(expr, i)
		case c == '>' || c == '<':
			return expr[:i]
		case (c == '=' || c == '!') && i+1 < len(expr) && expr[i+1] == '=':
			return expr[:i]
		default:
			i++
		}
	}
	return expr
}

func TestPromSelectors(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (model, le) (rate(a_bucket{model=~"$model", le="2.5"}[$__rate_interval]))`, []string{`a_bucket{model=~"$model", le="2.5"}`}},
		{`time() - b_seconds{replica=~"$model/$replica"} > 60`, []string{`b_seconds{replica=~"$model/$replica"}`}},
		{`x - on (model) label_replace(sum by (model_name) (rate(vllm:t_sum[5m])), "model", "$1", "model_name", "(.*)")`, []string{"x", "vllm:t_sum"}},
		{`rate(p_total[1m]) and on (job, instance) count by (job, instance) (h)`, []string{"p_total", "h"}},
		{`a > (14.4 * 0.01) and a offset 1d > 1e3`, []string{"a"}},
		{`g * (1 - o{m="}"})`, []string{"g", `o{m="}"}`}},
	} {
		if got := promSelectors(c.expr); !slices.Equal(got, c.want) {
			t.Errorf("promSelectors(%s) = %q, want %q", c.expr, got, c.want)
		}
	}
}

func TestAlertValues(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`x == 0`, []string{"x"}},
		{"sum by (m) (rate(a[5m]))\n/\n(b + c)\n> 0.05", []string{"sum by (m) (rate(a[5m]))\n/\n(b + c)"}},
		{`r5m > (14.4 * 0.01)
and
r1h > (14.4 * 0.01)`, []string{"r5m", "r1h"}},
		{`time() - t{a="x>y"} > 60`, []string{`time() - t{a="x>y"}`}},
		{`sum by (m) (h * (1 - o)) == 0`, []string{`sum by (m) (h * (1 - o))`}},
		{`a{band="1"} >= 2 unless b`, []string{`a{band="1"}`, "b"}},
	} {
		if got := alertValues(c.expr); !slices.Equal(got, c.want) {
			t.Errorf("alertValues(%q) = %q, want %q", c.expr, got, c.want)
		}
	}
}
