// Package otelcoltest runs a real OpenTelemetry Collector for tests: the
// one .ci/otelcol/build makes (the OTLP receiver, gRPC and HTTP, and the
// file exporter writing OTLP JSON), on loopback ports, with a
// configuration generated per run. A test sends spans to its endpoints
// and reads back what the Collector wrote, as the spans a tracing backend
// would get.
//
// The binary is $OTELCOL, else otelcol in the CI cache
// (${XDG_CACHE_HOME:-~/.cache}/gpurouter-ci/bin, where .ci/run builds
// it). Without one a test skips with one line, or fails under CI=true.
package otelcoltest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Env names the variable that gives the Collector binary's path.
const Env = "OTELCOL"

// CacheDir is where .ci/run keeps the binaries it builds.
func CacheDir() string {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "gpurouter-ci", "bin")
}

// Binary is the Collector to run: $OTELCOL, else the CI cache's. Without
// one, t skips with one line, or fails under CI=true (where .ci/run
// builds it). Not PATH: a Collector found there may lack the file
// exporter.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(Env); p != "" {
		if isExecutable(p) {
			return p
		}
		t.Fatalf("$%s=%s is not an executable file", Env, p)
	}
	if p := filepath.Join(CacheDir(), "otelcol"); isExecutable(p) {
		return p
	}
	msg := "no OpenTelemetry Collector ($" + Env + " or " + filepath.Join(CacheDir(), "otelcol") + "; .ci/otelcol/build makes it)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// Collector is one running Collector.
type Collector struct {
	// GRPCEndpoint and HTTPEndpoint are its OTLP receiver's, as URLs
	// (http://127.0.0.1:PORT): what a tracing.Config's Endpoint takes.
	GRPCEndpoint string
	HTTPEndpoint string

	file   string // where the file exporter writes
	cmd    *exec.Cmd
	out    *syncBuffer // its stdout and stderr
	exited chan struct{}
	err    error // Wait's, once exited is closed
	stop   sync.Once
}

// startTimeout bounds the Collector's start (it binds its ports in well
// under a second; a loaded CI machine gets room).
const startTimeout = 60 * time.Second

// Start runs a Collector from Binary(t); it stops when t ends (Stop). A
// start that loses a race for its ports is retried on others.
func Start(t testing.TB) *Collector {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	var err error
	for try := 0; try < 3; try++ {
		var c *Collector
		if c, err = start(bin, dir, try); err == nil {
			t.Cleanup(func() {
				if err := c.Stop(); err != nil {
					t.Errorf("otelcol: %v", err)
				}
			})
			return c
		}
	}
	t.Fatalf("otelcol: %v", err)
	return nil
}

func start(bin, dir string, try int) (*Collector, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	c := &Collector{
		GRPCEndpoint: "http://" + ports[0],
		HTTPEndpoint: "http://" + ports[1],
		file:         filepath.Join(dir, fmt.Sprintf("spans-%d.json", try)),
		out:          &syncBuffer{},
		exited:       make(chan struct{}),
	}
	cfgPath := filepath.Join(dir, fmt.Sprintf("otelcol-%d.yaml", try))
	if err := os.WriteFile(cfgPath, []byte(config(ports[0], ports[1], c.file)), 0o600); err != nil {
		return nil, err
	}
	c.cmd = exec.Command(bin, "--config", cfgPath)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { c.err = c.cmd.Wait(); close(c.exited) }()
	if err := c.awaitPorts(ports); err != nil {
		c.Stop() //nolint:errcheck // the start's error says more
		return nil, fmt.Errorf("%w\n%s", err, c.out.String())
	}
	return c, nil
}

// config is the Collector's configuration: both OTLP protocols on
// loopback, every span into file as OTLP JSON (one line per batch,
// flushed every 100ms), and no metrics server of its own (its default
// port 8888 would collide between tests).
func config(grpcAddr, httpAddr, file string) string {
	return fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
exporters:
  file:
    path: %s
    format: json
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
`, grpcAddr, httpAddr, strconv.Quote(file))
}

// freePorts reserves n loopback addresses by binding port 0, and frees
// them for the Collector to bind (a race Start retries).
func freePorts(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// awaitPorts waits until the Collector accepts connections on every
// address, or exits, or startTimeout passes.
func (c *Collector) awaitPorts(addrs []string) error {
	deadline := time.Now().Add(startTimeout)
	for _, a := range addrs {
		for {
			conn, err := net.DialTimeout("tcp", a, time.Second)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-c.exited:
				return fmt.Errorf("exited before serving %s: %v", a, c.err)
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("not serving %s after %v", a, startTimeout)
			}
		}
	}
	return nil
}

// Stop stops the Collector (SIGTERM: it flushes the file, then exits;
// killed after 10s) and reports an exit other than the one SIGTERM
// asks for. Idempotent.
func (c *Collector) Stop() error {
	var err error
	c.stop.Do(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(10 * time.Second):
				_ = c.cmd.Process.Kill()
				<-c.exited
				err = fmt.Errorf("did not stop within 10s of SIGTERM; killed\n%s", c.out.String())
				return
			}
		}
		if c.err != nil {
			err = fmt.Errorf("exit: %v\n%s", c.err, c.out.String())
		}
	})
	return err
}

// Output is what the Collector printed so far (its warnings and errors).
func (c *Collector) Output() string { return c.out.String() }

// Spans reads every span the Collector has written so far.
func (c *Collector) Spans() ([]Span, error) {
	data, err := os.ReadFile(c.file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // nothing received yet
	}
	if err != nil {
		return nil, err
	}
	return ParseFile(data)
}

// WaitForSpans reads the spans until done says they are all there, and
// returns them; t fails with what came when timeout passes first.
func (c *Collector) WaitForSpans(t testing.TB, timeout time.Duration, done func([]Span) bool) []Span {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		spans, err := c.Spans()
		if err != nil {
			t.Fatalf("otelcol: reading %s: %v", c.file, err)
		}
		if done(spans) {
			return spans
		}
		select {
		case <-ctx.Done():
			t.Fatalf("otelcol: after %v the spans are still not all there; got %d:\n%s\ncollector output:\n%s",
				timeout, len(spans), Describe(spans), c.out.String())
			return nil
		case <-c.exited:
			t.Fatalf("otelcol exited: %v\n%s", c.err, c.out.String())
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ParseFile reads the file exporter's JSON: one OTLP
// ExportTraceServiceRequest per line. A last line still being written
// (no newline yet) is left for the next read.
func ParseFile(data []byte) ([]Span, error) {
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		return nil, nil
	}
	var spans []Span
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		got, err := parseRequest(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		spans = append(spans, got...)
	}
	return spans, sc.Err()
}

// Describe lists spans one a line (name, ids, attributes), for failure
// messages.
func Describe(spans []Span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s kind=%d trace=%s span=%s parent=%s status=%d attrs=%v\n",
			s.Name, s.Kind, s.TraceID, s.SpanID, s.ParentSpanID, s.Status.Code, s.Attributes)
	}
	return b.String()
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the
// test's reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
