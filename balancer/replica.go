// Package balancer owns what a routing decision looks at: replicas with their
// live state (atomics and telemetry snapshots), pools of replicas serving one
// model, the policies that pick among them, health checks and circuit
// breakers. It does no forwarding; the proxy asks it for a replica and tells
// it how the request ended.
package balancer

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// ErrNotReplicaFault marks a request outcome that says nothing about the
// replica's health (the client went away, the client sent a bad request).
// Wrap it into the error given to a Lease's Done so the breaker ignores it.
var ErrNotReplicaFault = errors.New("balancer: outcome is not the replica's fault")

// ErrBreakerOpen is returned by Replica.Acquire when the replica's circuit
// breaker refuses traffic (open, or half-open with its probes in flight).
var ErrBreakerOpen = errors.New("balancer: circuit breaker open")

// ReplicaConfig describes one upstream engine.
type ReplicaConfig struct {
	Name   string  // label in metrics and logs; default: host:port of URL
	URL    string  // base URL, e.g. http://10.0.0.5:8000
	Weight float64 // relative capacity; 0 means DefaultWeight
}

// DefaultWeight is a replica's relative capacity when none is given.
const DefaultWeight = 1.0

// Replica is one upstream engine and everything the router knows about it
// right now. Its fields are read on the hot path without locks: counters are
// atomics, the breaker mirrors its state into an atomic, telemetry arrives
// as an immutable snapshot. Build with NewReplica; the zero value is unusable.
type Replica struct {
	name   string
	url    string
	addr   string // host:port
	tls    bool
	weight float64

	inFlight atomic.Int64 // requests the router has sent and not yet finished
	served   atomic.Int64 // requests ever acquired, for tests and debug views

	// healthy is the active health check's verdict. A replica starts healthy
	// so traffic flows before the first check completes.
	healthy atomic.Bool
	// openUntil mirrors the breaker: unix nanos until which it is open (0 =
	// closed or half-open). Pick skips the replica until then; after it the
	// breaker itself decides whether a probe may go through.
	openUntil atomic.Int64

	// restUntil is unix nanos until which the replica rests after refusing
	// a request (429/503): pickers skip it (0 = not resting; see Rest).
	restUntil   atomic.Int64
	restFrom    atomic.Int64 // unix nanos when the current rest began
	restWaiting atomic.Int64 // the engine's waiting queue at the refusal, as last scraped (-1 unknown)
	// pool is the pool the replica serves in, whose ejection cap its
	// breaker consults (nil outside a pool).
	pool atomic.Pointer[Pool]

	// draining is set by an operator: no new requests, in-flight finish.
	draining atomic.Bool
	// group is the in-flight total of the pool the replica belongs to, so
	// bounded-load policies read the mean load without a scan (nil when
	// the replica is in no pool).
	group atomic.Pointer[atomic.Int64]

	tel telemetry
	// pred is the replica's learned latency model (predict.go).
	pred predictor

	// alive is when (unix nanos) the replica last showed life through
	// traffic: a token relayed or a request completed. It lets the health
	// checker tell a replica too busy to answer a probe in time from a dead
	// one (0 = never).
	alive atomic.Int64

	kvReserved   atomic.Int64 // KV footprint (tokens) of requests in flight, router-side
	kv           kvLedger     // the same requests, for the fullest the KV cache will be (kvpeak.go)
	longPrefills atomic.Int64 // requests with a long prompt not yet past their first token

	idHash uint64 // hash of name, for rendezvous hashing
	// prefixSlot is the replica's slot in its pool's prefix index plus
	// one; 0: none (prefix.go).
	prefixSlot atomic.Int32
	// prefixPrompt and prefixCached sum the prompt tokens of requests
	// placed here with prefix keys, and how many of them the index said
	// were cached; prefixForgone how many more another replica held
	// (PrefixStats).
	prefixPrompt, prefixCached, prefixForgone atomic.Int64
	// lora is the router's record of the adapters on the replica (lora.go).
	lora loraTable

	// gpuErrs and faultSince belong to StoreGPU (one caller at a time).
	gpuErrs    uint64
	faultSince time.Time

	breaker     *gobreaker.TwoStepCircuitBreaker[struct{}]
	openTimeout time.Duration
	now         func() time.Time
}

// NewReplica builds a replica. now is the clock used to stamp breaker state
// changes (nil means time.Now).
func NewReplica(cfg ReplicaConfig, bc BreakerConfig, now func() time.Time) (*Replica, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, err
	}
	if u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, errors.New("balancer: replica URL must be http(s)://host[:port]: " + cfg.URL)
	}
	// NaN would make every load comparison false and +Inf would make the
	// replica look idle forever; both come from YAML's .nan/.inf.
	if math.IsNaN(cfg.Weight) || math.IsInf(cfg.Weight, 0) {
		return nil, fmt.Errorf("balancer: replica %s: weight must be a finite number, got %v", cfg.URL, cfg.Weight)
	}
	if now == nil {
		now = time.Now
	}
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	r := &Replica{
		name:   cfg.Name,
		url:    cfg.URL,
		addr:   addr,
		tls:    u.Scheme == "https",
		weight: cfg.Weight,
		now:    now,
	}
	if r.name == "" {
		r.name = addr
	}
	if r.weight <= 0 {
		r.weight = DefaultWeight
	}
	r.healthy.Store(true)
	r.idHash = hashString(r.name)
	bc = bc.withDefaults()
	r.openTimeout = bc.OpenTimeout
	r.breaker = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        r.name,
		MaxRequests: uint32(bc.HalfOpenRequests),
		Timeout:     bc.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			if c.ConsecutiveFailures < uint32(bc.ConsecutiveFailures) {
				return false
			}
			p := r.pool.Load()
			return p == nil || p.mayEject(r, r.now())
		},
		IsExcluded:    func(err error) bool { return errors.Is(err, ErrNotReplicaFault) },
		OnStateChange: func(_ string, _, to gobreaker.State) { r.breakerChanged(to) },
	})
	return r, nil
}

func (r *Replica) breakerChanged(to gobreaker.State) {
	if to == gobreaker.StateOpen {
		r.openUntil.Store(r.now().Add(r.openTimeout).UnixNano())
		return
	}
	r.openUntil.Store(0)
}

// Name is the replica's label in metrics and logs.
func (r *Replica) Name() string { return r.name }

// URL is the replica's base URL.
func (r *Replica) URL() string { return r.url }

// Addr is host:port to dial.
func (r *Replica) Addr() string { return r.addr }

// TLS reports whether the replica is reached over https.
func (r *Replica) TLS() bool { return r.tls }

// Weight is the replica's relative capacity (≥ some positive number).
func (r *Replica) Weight() float64 { return r.weight }

// InFlight is the number of requests the router has sent to the replica
// and not yet seen finish (the stream closed).
func (r *Replica) InFlight() int64 { return r.inFlight.Load() }

// Served is how many requests were ever sent to the replica.
func (r *Replica) Served() int64 { return r.served.Load() }

// Healthy is the active health check's current verdict.
func (r *Replica) Healthy() bool { return r.healthy.Load() }

// SetHealthy records the health check's verdict.
func (r *Replica) SetHealthy(ok bool) { r.healthy.Store(ok) }

// BreakerState is the circuit breaker's state: "closed", "half-open" or "open".
func (r *Replica) BreakerState() string { return r.breaker.State().String() }

// Available reports whether a picker may choose the replica at now: healthy
// and its breaker not open (an open breaker whose timeout has passed counts
// as available, so the breaker gets its half-open probe). A zero now means
// the replica's own clock.
func (r *Replica) Available(now time.Time) bool {
	if !r.healthy.Load() || r.draining.Load() || r.gpuFault() {
		return false
	}
	until := r.openUntil.Load()
	if until == 0 {
		return true
	}
	// The zero time's UnixNano overflows int64 (it lies before 1678) and
	// comes out as a large negative number, which would keep a replica whose
	// breaker opened out of every pick made with a zero Request.Now: no pick,
	// so no Acquire, so the breaker never moves to half-open unless something
	// else (a metrics scrape) happens to ask for its state.
	if now.IsZero() {
		now = r.now()
	}
	return now.UnixNano() >= until
}

// KVReserved is the KV-cache footprint, in tokens, the router has sent to
// the replica and not yet seen finish (prompt plus expected output each).
func (r *Replica) KVReserved() int64 { return r.kvReserved.Load() }

// LongPrefills is how many long-prompt requests on the replica have not yet
// produced their first token.
func (r *Replica) LongPrefills() int64 { return r.longPrefills.Load() }

// SetDraining marks the replica as draining (no new requests; those in
// flight finish) or returns it to service.
func (r *Replica) SetDraining(on bool) { r.draining.Store(on) }

// Draining reports whether the replica is draining.
func (r *Replica) Draining() bool { return r.draining.Load() }

// aliveResolution is how stale the alive stamp may get: under heavy
// streaming every token would otherwise store to the same cache line from
// every stream on the replica.
const aliveResolution = 100 * time.Millisecond

func (r *Replica) markAlive(now time.Time) {
	n := now.UnixNano()
	if n-r.alive.Load() >= int64(aliveResolution) {
		r.alive.Store(n)
	}
}

// AliveWithin reports whether the replica delivered output (a token or a
// completed response) within d before its clock's now.
func (r *Replica) AliveWithin(d time.Duration) bool {
	a := r.alive.Load()
	return a != 0 && r.now().UnixNano()-a <= int64(d)
}
