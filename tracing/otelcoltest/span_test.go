package otelcoltest

import (
	"os"
	"reflect"
	"testing"
	"time"
)

// TestParseFile reads what the Collector's file exporter wrote
// (testdata/spans.json: one line, written by the CI Collector for an
// OTLP/JSON request), and leaves a line still being written for later.
func TestParseFile(t *testing.T) {
	data, err := os.ReadFile("testdata/spans.json")
	if err != nil {
		t.Fatal(err)
	}
	spans, err := ParseFile(data)
	if err != nil {
		t.Fatal(err)
	}
	want := Span{
		TraceID: "5b8efff798038103d269b633813fc60c", SpanID: "eee19b7ec3c1b174", Name: "s", Kind: KindServer,
		Start: time.Unix(0, 1), End: time.Unix(0, 2),
		Attributes: map[string]any{"n": int64(3), "f": 1.5, "l": []any{"a"}},
		Events:     []Event{{Name: "e", Time: time.Unix(0, 1), Attributes: map[string]any{}}},
		Status:     Status{Code: StatusError, Message: "m"},
		Resource:   map[string]any{"service.name": "x"},
	}
	if len(spans) != 1 || !reflect.DeepEqual(spans[0], want) {
		t.Fatalf("got %+v\nwant %+v", spans, want)
	}

	partial := append(append([]byte{}, data...), data[:len(data)/2]...)
	if got, err := ParseFile(partial); err != nil || len(got) != 1 {
		t.Errorf("with a partial last line: %d spans, %v", len(got), err)
	}
	if got, err := ParseFile(data[:len(data)/2]); err != nil || len(got) != 0 {
		t.Errorf("only a partial line: %d spans, %v", len(got), err)
	}
	if _, err := ParseFile([]byte("{\"resourceSpans\":[{]}\n")); err == nil {
		t.Error("bad JSON: no error")
	}
}

func FuzzParseFile(f *testing.F) {
	data, err := os.ReadFile("testdata/spans.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte("{}\n{\"resourceSpans\":[]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ParseFile(data) // no panic, whatever the file holds
	})
}
