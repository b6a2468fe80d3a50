package proxy

import "time"

// Config is the proxy's plain configuration. Zero fields take the defaults
// in brackets (see withDefaults); cmd/gpurouter fills it from the YAML file.
type Config struct {
	ConnectTimeout   time.Duration // TCP connect to a replica [2s]
	FirstByteTimeout time.Duration // request written → first response byte [120s]
	IdleTimeout      time.Duration // longest gap between two reads of a response stream [60s]
	TotalTimeout     time.Duration // whole request; 0 = unlimited [0]
	MaxBodyBytes     int           // request body limit [8 MiB]
	MaxHeaderBytes   int           // request line + headers limit (fasthttp's read buffer); more is 431 [16 KiB]
	ReadTimeout      time.Duration // a client must send its whole request within this (slowloris) [60s]
	MaxConnections   int           // concurrent client connections; more are refused with 503 [10000]
	MaxResponseBytes int           // non-streamed response body limit [64 MiB]

	MaxAttempts int           // tries per request including the first [3]
	BackoffBase time.Duration // first retry backoff, doubled per retry, full jitter [10ms]
	BackoffMax  time.Duration // retry backoff cap [200ms]

	MaxConnsPerReplica int           // connections (= concurrent streams) per replica [1024]
	MaxIdleConnTime    time.Duration // keep-alive idle time, below uvicorn's 5s [4s]

	// DisconnectCheck is how often a stream with nothing to write checks
	// whether its client is still connected, so an engine stuck in a long
	// prefill is aborted soon after the client leaves [200ms].
	DisconnectCheck time.Duration

	// RecordRing is how many recent per-request timing records
	// /debug/requests keeps [8192].
	RecordRing int
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
	def(&c.ConnectTimeout, 2*time.Second)
	def(&c.FirstByteTimeout, 120*time.Second)
	def(&c.IdleTimeout, 60*time.Second)
	def(&c.BackoffBase, 10*time.Millisecond)
	def(&c.BackoffMax, 200*time.Millisecond)
	def(&c.MaxIdleConnTime, 4*time.Second)
	def(&c.DisconnectCheck, 200*time.Millisecond)
	def(&c.ReadTimeout, 60*time.Second)
	defInt(&c.MaxBodyBytes, 8<<20)
	defInt(&c.MaxHeaderBytes, 16<<10)
	defInt(&c.MaxConnections, 10000)
	defInt(&c.MaxResponseBytes, 64<<20)
	defInt(&c.MaxAttempts, 3)
	defInt(&c.MaxConnsPerReplica, 1024)
	defInt(&c.RecordRing, 8192)
	if c.TotalTimeout < 0 {
		c.TotalTimeout = 0
	}
	return c
}
