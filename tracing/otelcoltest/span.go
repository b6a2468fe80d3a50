package otelcoltest

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Span is one span as the Collector wrote it, flattened with its resource
// and scope.
type Span struct {
	TraceID      string // 32 hex digits
	SpanID       string // 16 hex digits
	ParentSpanID string // "" for a root
	TraceState   string
	Name         string
	Kind         SpanKind
	Start, End   time.Time
	// Attributes by key: string, int64, float64, bool, or []any of those.
	Attributes map[string]any
	Events     []Event
	Status     Status
	Resource   map[string]any // the resource's attributes
	Scope      string         // the instrumentation scope's name
}

// SpanKind is OTLP's span kind.
type SpanKind int

// OTLP's span kinds.
const (
	KindUnspecified SpanKind = iota
	KindInternal
	KindServer
	KindClient
	KindProducer
	KindConsumer
)

// Event is a span event.
type Event struct {
	Name       string
	Time       time.Time
	Attributes map[string]any
}

// Status is a span's status: Code 0 unset, 1 ok, 2 error.
type Status struct {
	Code    int
	Message string
}

// StatusError is Status.Code of a failed span.
const StatusError = 2

// The OTLP JSON encoding (protobuf's canonical JSON, ids in hex, 64-bit
// integers as strings, enums as numbers).
type (
	exportRequest struct {
		ResourceSpans []struct {
			Resource struct {
				Attributes []keyValue `json:"attributes"`
			} `json:"resource"`
			ScopeSpans []struct {
				Scope struct {
					Name string `json:"name"`
				} `json:"scope"`
				Spans []jsonSpan `json:"spans"`
			} `json:"scopeSpans"`
		} `json:"resourceSpans"`
	}
	jsonSpan struct {
		TraceID      string      `json:"traceId"`
		SpanID       string      `json:"spanId"`
		ParentSpanID string      `json:"parentSpanId"`
		TraceState   string      `json:"traceState"`
		Name         string      `json:"name"`
		Kind         int         `json:"kind"`
		Start        json.Number `json:"startTimeUnixNano"`
		End          json.Number `json:"endTimeUnixNano"`
		Attributes   []keyValue  `json:"attributes"`
		Events       []struct {
			Name       string      `json:"name"`
			Time       json.Number `json:"timeUnixNano"`
			Attributes []keyValue  `json:"attributes"`
		} `json:"events"`
		Status struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"status"`
	}
	keyValue struct {
		Key   string   `json:"key"`
		Value anyValue `json:"value"`
	}
	anyValue struct {
		String *string      `json:"stringValue"`
		Int    *json.Number `json:"intValue"`
		Double *float64     `json:"doubleValue"`
		Bool   *bool        `json:"boolValue"`
		Array  *struct {
			Values []anyValue `json:"values"`
		} `json:"arrayValue"`
	}
)

func parseRequest(line []byte) ([]Span, error) {
	var req exportRequest
	if err := json.Unmarshal(line, &req); err != nil {
		return nil, err
	}
	var out []Span
	for _, rs := range req.ResourceSpans {
		res, err := attrMap(rs.Resource.Attributes)
		if err != nil {
			return nil, err
		}
		for _, ss := range rs.ScopeSpans {
			for _, js := range ss.Spans {
				s, err := js.span()
				if err != nil {
					return nil, fmt.Errorf("span %s: %w", js.Name, err)
				}
				s.Resource, s.Scope = res, ss.Scope.Name
				out = append(out, s)
			}
		}
	}
	return out, nil
}

func (js jsonSpan) span() (Span, error) {
	s := Span{TraceID: js.TraceID, SpanID: js.SpanID, ParentSpanID: js.ParentSpanID, TraceState: js.TraceState,
		Name: js.Name, Kind: SpanKind(js.Kind), Status: Status{Code: js.Status.Code, Message: js.Status.Message}}
	var err error
	if s.Start, err = unixNano(js.Start); err != nil {
		return s, err
	}
	if s.End, err = unixNano(js.End); err != nil {
		return s, err
	}
	if s.Attributes, err = attrMap(js.Attributes); err != nil {
		return s, err
	}
	for _, je := range js.Events {
		e := Event{Name: je.Name}
		if e.Time, err = unixNano(je.Time); err != nil {
			return s, err
		}
		if e.Attributes, err = attrMap(je.Attributes); err != nil {
			return s, err
		}
		s.Events = append(s.Events, e)
	}
	return s, nil
}

func unixNano(n json.Number) (time.Time, error) {
	if n == "" {
		return time.Time{}, nil
	}
	ns, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("time %q: %w", n, err)
	}
	return time.Unix(0, ns), nil
}

func attrMap(kvs []keyValue) (map[string]any, error) {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		v, err := kv.Value.value()
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", kv.Key, err)
		}
		m[kv.Key] = v
	}
	return m, nil
}

func (v anyValue) value() (any, error) {
	switch {
	case v.String != nil:
		return *v.String, nil
	case v.Int != nil:
		return strconv.ParseInt(string(*v.Int), 10, 64)
	case v.Double != nil:
		return *v.Double, nil
	case v.Bool != nil:
		return *v.Bool, nil
	case v.Array != nil:
		out := make([]any, 0, len(v.Array.Values))
		for _, e := range v.Array.Values {
			x, err := e.value()
			if err != nil {
				return nil, err
			}
			out = append(out, x)
		}
		return out, nil
	}
	return nil, nil // an empty value
}
