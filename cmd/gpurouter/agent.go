package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/gpurouter/gpurouter/gpu"
)

// defaultAgentListen is `gpurouter agent`'s port: next to the DCGM
// exporter's 9400.
const defaultAgentListen = ":9401"

// runAgent is `gpurouter agent`: this host's NVML GPU stats over HTTP, for
// routers on other hosts (gpu.AgentSource reads GET /v1/gpus). Without an
// NVIDIA driver it still serves, an empty list, after one log line.
func runAgent(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", defaultAgentListen, "address to serve GET /v1/gpus (JSON), GET /metrics (Prometheus) and GET /health on")
	level := fs.String("log-level", "info", "debug|info|warn|error")
	format := fs.String("log-format", "json", "json|console")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpurouter agent [--listen ADDR]")
		fmt.Fprintln(stderr, "\nServes this host's NVML GPU stats for routers on other hosts.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gpurouter agent: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	log, err := newLogger(logConfig{Level: *level, Format: *format}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "gpurouter agent:", err)
		return 2
	}
	defer log.Sync() //nolint:errcheck

	// One NVML session for the process; opening it now puts the "on" or
	// "off" line at startup rather than at the first request.
	session := gpu.NewLocalNVML(log)
	defer session.Close()
	if err := session.Open(); err != nil && !errors.Is(err, gpu.ErrGPUOff) {
		log.Error("NVML", zap.Error(err))
		return 1
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	agent, err := gpu.NewAgent(gpu.AgentConfig{Source: gpu.NewNVMLSource(session, gpu.Selector{}), Registry: reg, Log: log})
	if err != nil {
		log.Error("agent", zap.Error(err))
		return 1
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listen", zap.Error(err))
		return 1
	}
	log.Info("gpurouter agent listening", zap.String("listen", ln.Addr().String()))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := agent.Serve(ctx, ln); err != nil {
		log.Error("serve", zap.Error(err))
		return 1
	}
	log.Info("gpurouter agent stopped")
	return 0
}
