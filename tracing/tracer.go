package tracing

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the router's spans.
const ScopeName = "github.com/gpurouter/gpurouter/tracing"

// Tracer makes the router's spans and carries their context to the
// engines. Build one with New; a nil *Tracer and the zero Tracer are off:
// StartRequest returns nil, and every method of a nil *Request is a no-op
// that allocates nothing. Safe for concurrent use.
type Tracer struct {
	tp      *sdktrace.TracerProvider // nil: off
	tracer  trace.Tracer
	timeout time.Duration // Shutdown's bound when its context has none
}

// Options are a Tracer's optional parts; the zero value has none.
type Options struct {
	// ServiceVersion is the resource's service.version and the scope's
	// version; "" leaves them out.
	ServiceVersion string
	// OnExportError hears of every export that failed, with the number of
	// spans dropped with it (the batch is not kept). nil sends them to the
	// OpenTelemetry SDK's process-wide error handler, which logs them.
	OnExportError func(err error, spans int)
	// Exporter replaces the OTLP exporter that Config describes and turns
	// tracing on without an endpoint: for tests (tracetest's in-memory
	// exporter). nil means OTLP.
	Exporter sdktrace.SpanExporter
	// IDs makes trace and span ids; nil means the SDK's random ones.
	IDs sdktrace.IDGenerator
}

// New builds the Tracer cfg describes. Off (the zero Config, no
// Options.Exporter) it builds nothing and starts nothing. On, it starts
// what the SDK starts and offers no way to run under a Run(ctx) of ours:
// the batch span processor's goroutine (spans are queued, up to 2048, and
// exported in batches of up to 512 every 5s or when a batch fills) and,
// for grpc, gRPC's client machinery, which connects lazily. Shutdown
// stops them. ctx bounds only the construction (resource detection).
//
// New sets no process-wide OpenTelemetry state (the global tracer
// provider, propagator or error handler): the command may.
func New(ctx context.Context, cfg Config, opts Options) (*Tracer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() && opts.Exporter == nil {
		return &Tracer{}, nil
	}
	exp := opts.Exporter
	if exp == nil {
		var err error
		if exp, err = newExporter(ctx, cfg); err != nil {
			return nil, fmt.Errorf("tracing: exporter: %w", err)
		}
	}
	if opts.OnExportError != nil {
		exp = reportingExporter{SpanExporter: exp, report: opts.OnExportError}
	}
	res, err := newResource(ctx, cfg, opts.ServiceVersion)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tpOpts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		// The caller's sampled flag decides; the ratio decides the traces
		// the router starts (by trace id, so every router and engine that
		// sees the id without a parent decides alike).
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.samplingRatio()))),
		sdktrace.WithBatcher(exp, sdktrace.WithExportTimeout(cfg.timeout())),
	}
	if opts.IDs != nil {
		tpOpts = append(tpOpts, sdktrace.WithIDGenerator(opts.IDs))
	}
	tp := sdktrace.NewTracerProvider(tpOpts...)
	return &Tracer{
		tp: tp,
		tracer: tp.Tracer(ScopeName, trace.WithInstrumentationVersion(opts.ServiceVersion),
			trace.WithSchemaURL(semconv.SchemaURL)),
		timeout: cfg.timeout(),
	}, nil
}

// Enabled reports whether t records anything: false for nil and for a
// Tracer built from a Config that is off. The request path may test it
// before gathering what a span would carry.
func (t *Tracer) Enabled() bool { return t != nil && t.tp != nil }

// ForceFlush exports the spans ended so far, waiting for ctx.
func (t *Tracer) ForceFlush(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	return t.tp.ForceFlush(ctx)
}

// Shutdown exports the spans still queued and stops the exporter, waiting
// until ctx's deadline, or at most the configured timeout when ctx has
// none. Spans started afterwards are dropped. Idempotent; nil for a
// Tracer that is off.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.timeout)
		defer cancel()
	}
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// newExporter is the OTLP exporter cfg describes. The exporters read the
// OTEL_EXPORTER_OTLP_* environment variables beneath the options given
// here: headers and a CA certificate may come from there.
func newExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, error) {
	if cfg.protocol() == ProtocolHTTP {
		o := []otlptracehttp.Option{
			otlptracehttp.WithEndpointURL(httpEndpoint(cfg.Endpoint)),
			otlptracehttp.WithTimeout(cfg.timeout()),
		}
		if len(cfg.Headers) > 0 {
			o = append(o, otlptracehttp.WithHeaders(cfg.Headers))
		}
		return otlptracehttp.New(ctx, o...)
	}
	o := []otlptracegrpc.Option{
		// The scheme says TLS or plain text (http:// is insecure).
		otlptracegrpc.WithEndpointURL(cfg.Endpoint),
		otlptracegrpc.WithTimeout(cfg.timeout()),
	}
	if len(cfg.Headers) > 0 {
		o = append(o, otlptracegrpc.WithHeaders(cfg.Headers))
	}
	return otlptracegrpc.New(ctx, o...)
}

// httpEndpoint is endpoint with HTTPTracesPath when it has no path: the
// exporter would post to "/" (it takes a URL as given).
func httpEndpoint(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Path != "" && u.Path != "/") {
		return endpoint // Validate refused the first; the second is given
	}
	u.Path = HTTPTracesPath
	return u.String()
}

// newResource describes the router: defaults, then the SDK's and the
// host's attributes, then OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME,
// then cfg's, each winning over those before it.
func newResource(ctx context.Context, cfg Config, version string) (*resource.Resource, error) {
	base := []attribute.KeyValue{semconv.ServiceName(DefaultServiceName)}
	if version != "" {
		base = append(base, semconv.ServiceVersion(version))
	}
	own := make([]attribute.KeyValue, 0, len(cfg.ResourceAttributes))
	for _, k := range sortedKeys(cfg.ResourceAttributes) {
		own = append(own, attribute.String(k, cfg.ResourceAttributes[k]))
	}
	return resource.New(ctx,
		resource.WithAttributes(base...),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithFromEnv(),
		resource.WithAttributes(own...),
	)
}

// reportingExporter hands a failed export to report instead of the SDK's
// process-wide error handler (which a library must not set).
type reportingExporter struct {
	sdktrace.SpanExporter
	report func(err error, spans int)
}

func (e reportingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if err := e.SpanExporter.ExportSpans(ctx, spans); err != nil {
		e.report(err, len(spans))
	}
	return nil
}
