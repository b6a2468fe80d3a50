package main

import (
	"context"
	"errors"
	"maps"

	"github.com/gpurouter/gpurouter/tracing"
	"go.uber.org/zap"
)

// applyTracingDefaults fills tc's defaults (the tracing package's), so
// that --print-config shows them while tracing is off too.
func applyTracingDefaults(tc *tracingConfig) {
	setString(&tc.Protocol, string(tracing.DefaultProtocol))
	setDuration(&tc.Timeout, tracing.DefaultTimeout)
	if tc.SamplingRatio == nil {
		r := tracing.DefaultSamplingRatio
		tc.SamplingRatio = &r
	}
	// "headers: {}" and no headers are the same configuration; one
	// spelling keeps printed-then-reloaded configs equal.
	if len(tc.Headers) == 0 {
		tc.Headers = nil
	}
	if len(tc.ResourceAttributes) == 0 {
		tc.ResourceAttributes = nil
	}
}

// tracingFrom is the tracing package's Config of the file's options.
func tracingFrom(tc tracingConfig) tracing.Config {
	return tracing.Config{
		Endpoint:           tc.Endpoint,
		Protocol:           tracing.Protocol(tc.Protocol),
		Headers:            tc.Headers,
		SamplingRatio:      tc.SamplingRatio,
		ResourceAttributes: tc.ResourceAttributes,
		Timeout:            tc.Timeout,
	}
}

// newTracer is the Tracer of tc (off without an endpoint): failed exports
// are logged, with the spans they dropped.
func newTracer(tc tracingConfig, log *zap.Logger) (*tracing.Tracer, error) {
	t, err := tracing.New(context.Background(), tracingFrom(tc), tracing.Options{
		OnExportError: func(err error, spans int) {
			log.Warn("tracing: export failed, spans dropped", zap.Int("spans", spans), zap.Error(err))
		},
	})
	if err != nil {
		return nil, err // "tracing: ..."
	}
	if t.Enabled() {
		log.Info("tracing on", zap.String("endpoint", tc.Endpoint), zap.String("protocol", tc.Protocol),
			zap.Float64p("sampling_ratio", tc.SamplingRatio))
	}
	return t, nil
}

// tracing adds each problem of tc, at its option's path.
func (v *validator) tracing(tc tracingConfig) {
	err := tracingFrom(tc).Validate()
	if err == nil {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		if fe := (*tracing.FieldError)(nil); errors.As(e, &fe) {
			v.add("tracing."+fe.Key, "%s", fe.Msg)
		} else {
			v.add("tracing", "%v", e)
		}
	}
}

// redacted is tc with its header values hidden: they are credentials
// more often than not.
func (tc tracingConfig) redacted() tracingConfig {
	if len(tc.Headers) > 0 {
		tc.Headers = maps.Clone(tc.Headers)
		for k := range tc.Headers {
			tc.Headers[k] = "REDACTED"
		}
	}
	return tc
}
