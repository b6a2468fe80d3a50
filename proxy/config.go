package proxy

import (
	"runtime"
	"time"
)

// Defaults for Config's zero fields; cmd/gpurouter's file schema documents
// and fills the same values.
const (
	DefaultConnectTimeout     = 2 * time.Second
	DefaultFirstByteTimeout   = 120 * time.Second
	DefaultIdleTimeout        = 60 * time.Second
	DefaultMaxBodyBytes       = 8 << 20
	DefaultMaxHeaderBytes     = 16 << 10
	DefaultReadTimeout        = 60 * time.Second
	DefaultMaxConnections     = 10000
	DefaultMaxResponseBytes   = 64 << 20
	DefaultMaxAttempts        = 3
	DefaultBackoffBase        = 10 * time.Millisecond
	DefaultBackoffMax         = 200 * time.Millisecond
	DefaultMaxConnsPerReplica = 1024
	DefaultMaxIdleConnTime    = 4 * time.Second // below uvicorn's 5 s keep-alive
	DefaultMaxUpstreamHeader  = 1 << 10
	DefaultDisconnectCheck    = 200 * time.Millisecond
	DefaultRecordRing         = 8192
)

// Config is the proxy's plain configuration. Zero fields take the defaults
// in brackets (see withDefaults); cmd/gpurouter fills it from the YAML file.
type Config struct {
	ConnectTimeout   time.Duration // TCP connect to a replica [2s]
	FirstByteTimeout time.Duration // request written → first response byte [120s]
	IdleTimeout      time.Duration // longest gap between two reads of a response stream, and longest one write of a response to the client may block [60s]
	TotalTimeout     time.Duration // whole request; 0 = unlimited [0]
	MaxBodyBytes     int           // request body limit [8 MiB]
	MaxHeaderBytes   int           // request line + headers limit, at the front door (frontdoor.go) and as fasthttp's read buffer; more is 431 [16 KiB]
	ReadTimeout      time.Duration // a client must send its whole request within this (slowloris) [60s]
	MaxConnections   int           // concurrent client connections; more are refused with 503 [10000]
	MaxResponseBytes int           // non-streamed response body limit [64 MiB]

	MaxAttempts int           // tries per request including the first [3]
	BackoffBase time.Duration // first retry backoff, doubled per retry, full jitter [10ms]
	BackoffMax  time.Duration // retry backoff cap [200ms]

	MaxConnsPerReplica int           // connections (= concurrent streams) per replica, both request paths' together (conncap.go) [1024]
	MaxIdleConnTime    time.Duration // keep-alive idle time, below uvicorn's 5s [4s]
	// MaxUpstreamHeader bounds an engine's response line + headers: it is
	// the upstream connection's read buffer, which every stream holds to
	// its end; a bigger head is a bad upstream (502). vLLM and SGLang send
	// about 150 bytes, TGI about 500 [1 KiB].
	MaxUpstreamHeader int

	// DisconnectCheck is how often a stream with nothing to write checks
	// whether its client is still connected, so an engine stuck in a long
	// prefill is aborted soon after the client leaves [200ms].
	DisconnectCheck time.Duration

	// RecordRing is how many recent per-request timing records
	// /debug/requests keeps [8192].
	RecordRing int

	// GoroutineStreams relays every stream on a goroutine of its own, as
	// fasthttp's body, instead of in the stream loop (pump_linux.go; Linux
	// only), which costs less CPU per event [false].
	GoroutineStreams bool
	// StreamLoops is how many stream loops share the streams served on
	// fasthttp's path (a request loop relays its own), each on a thread
	// of its own (new streams go to each in turn): at
	// ~10 µs of CPU an event (`gpurouter bench proxy-cost`) one loop's core
	// relays about 100k events a second, so a large router needs several
	// [0: one per four of GOMAXPROCS, at least one].
	StreamLoops int
	// GoroutineRequests serves every request on fasthttp's goroutine per
	// connection, without request loops [false].
	GoroutineRequests bool
	// RequestLoops is how many request loops serve API requests, each on
	// a thread of its own, instead of fasthttp's goroutine per connection
	// (reqloop_linux.go; Linux only): about a quarter less CPU a request
	// (`gpurouter bench proxy-cost`); a loop relays its streams' events
	// too, unless GoroutineStreams (reqloop_stream_linux.go).
	// Connections go to each loop in turn; a request a loop does not serve
	// goes to fasthttp's path with its connection. One loop serves about
	// 30k requests a second on a core [0: one per two of GOMAXPROCS, at
	// least one].
	RequestLoops int
	// UnbatchedIO makes each read and write of a loop — a stream's, a
	// request's, an answer's — a system call of its own. Otherwise a loop
	// makes one wake-up's reads in one io_uring_enter(2), then their
	// writes in another (pump_batch_linux.go, reqloop_batch_linux.go;
	// Linux 5.18+, where the kernel and its seccomp profile allow io_uring,
	// else unbatched with one log line) [false].
	UnbatchedIO bool
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt := func(d *int, v int) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.ConnectTimeout, DefaultConnectTimeout)
	def(&c.FirstByteTimeout, DefaultFirstByteTimeout)
	def(&c.IdleTimeout, DefaultIdleTimeout)
	def(&c.BackoffBase, DefaultBackoffBase)
	def(&c.BackoffMax, DefaultBackoffMax)
	def(&c.MaxIdleConnTime, DefaultMaxIdleConnTime)
	def(&c.DisconnectCheck, DefaultDisconnectCheck)
	def(&c.ReadTimeout, DefaultReadTimeout)
	defInt(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	defInt(&c.MaxHeaderBytes, DefaultMaxHeaderBytes)
	defInt(&c.MaxConnections, DefaultMaxConnections)
	defInt(&c.MaxResponseBytes, DefaultMaxResponseBytes)
	defInt(&c.MaxAttempts, DefaultMaxAttempts)
	defInt(&c.MaxConnsPerReplica, DefaultMaxConnsPerReplica)
	defInt(&c.MaxUpstreamHeader, DefaultMaxUpstreamHeader)
	defInt(&c.RecordRing, DefaultRecordRing)
	if c.TotalTimeout < 0 {
		c.TotalTimeout = 0
	}
	if c.StreamLoops <= 0 {
		c.StreamLoops = max(1, runtime.GOMAXPROCS(0)/4)
	}
	if c.RequestLoops <= 0 {
		c.RequestLoops = max(1, runtime.GOMAXPROCS(0)/2)
	}
	return c
}
