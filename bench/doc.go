// Package bench is gpurouter's load generator and metric math: the engine of
// `gpurouter bench`.
//
// It takes the same inputs as `vllm bench serve` (datasets, request rate,
// burstiness, max concurrency) and computes the same numbers with the same
// definitions (DESIGN.md, "Latency definitions"), so a result from one can be
// read next to a result from the other:
//
//   - datasets (dataset*.go) turn a file or a recipe into []Request;
//   - Schedule (arrival.go) turns a rate and a burstiness into send offsets;
//   - Run (loadgen.go) sends the requests as streams over fasthttp and keeps a
//     Record per request (sent time, TTFT, every inter-token gap, tokens, error);
//   - Summarize (metrics.go) reduces a Result to vllm-bench metrics;
//   - WriteConsole and WriteJSON (report.go, resultjson.go) print them the way
//     vllm bench does;
//   - promhist.go scrapes Prometheus histograms before and after a run and
//     turns the difference into quantiles with bucket-width error bars, for
//     the engine's (vllm:*) and the router's (gpurouter_*) view of the same run.
//
// The simulated engine lives in the sub-package bench/sim.
package bench
