package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"
)

// Sink receives one replica's events in sequence order;
// *prefixcache.Tracker implements it. Calls come from the Subscriber's Run
// goroutine, one at a time. The event's slices are reused after Apply
// returns: copy what must be kept.
type Sink interface {
	// Apply applies one event.
	Apply(e *Event)
	// Reset drops everything known about the replica: events were lost
	// and replay could not recover them, or the engine restarted.
	Reset()
}

// Clock is the subscriber's time source, injected so tests decide how
// long backoffs and replay timeouts last. nil means real time.
type Clock interface {
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Defaults of SubscriberConfig's zero fields.
const (
	DefaultReplayTimeout = 2 * time.Second
	DefaultMinBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff    = 5 * time.Second
	DefaultIdleReplay    = time.Second
)

// SubscriberConfig configures one replica's Subscriber. Endpoint and Sink
// are required.
type SubscriberConfig struct {
	Pool, Replica string // labels in metrics and logs
	// Endpoint is the engine's PUB socket (vLLM: port 5557 + dp rank).
	Endpoint string
	// ReplayEndpoint is the engine's replay ROUTER socket; "" = none, and
	// then every gap or reconnect drops the replica's entries.
	ReplayEndpoint string
	// Topic is the subscription prefix; "" receives every topic.
	Topic string
	Sink  Sink
	// Metrics receives counters; nil = none.
	Metrics *Metrics
	// Log receives one line per resync and per connection change; nil =
	// none.
	Log *zap.Logger
	// Clock paces reconnects and replay timeouts; nil = real time.
	Clock Clock
	// ReplayTimeout bounds one replay; 0 = DefaultReplayTimeout.
	ReplayTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between connection
	// attempts, doubling from one to the other; 0 = the defaults.
	MinBackoff, MaxBackoff time.Duration
	// IdleReplay is how long the PUB socket may stay silent before the
	// subscriber asks the replay socket whether it missed anything: the
	// last batches before a pause show no gap until the next one arrives
	// (a batch sent while the subscription was still on its way is dropped
	// by PUB; so is one lost on the way). 0 = DefaultIdleReplay; negative =
	// never.
	IdleReplay time.Duration
}

// Subscriber follows one replica's KV events: it subscribes to the
// engine's PUB socket, checks every message's sequence number, and keeps
// the Sink exactly in step with the engine or says it can't:
//
//   - on connecting (and reconnecting) it asks the replay socket for what
//     it missed (everything buffered, the first time);
//   - a gap in sequence numbers asks replay for the missing batches;
//   - when replay can't close a gap (no replay socket, a timeout, the
//     batches already gone from the engine's buffer, a batch that does not
//     decode) the Sink is Reset and rebuilt from the events that follow:
//     it may then miss blocks the engine has, never claim blocks it
//     dropped;
//   - a sequence number going back (below what replay delivered) is an
//     engine restart: Reset, then replay from 0.
//
// A restart the subscriber never sees (it reconnects after the new
// process has passed the old one's sequence numbers) is undetectable in
// vLLM's protocol: call Resync when something else shows one (the
// engine's counters going back). Build with NewSubscriber; Run does the
// work.
type Subscriber struct {
	cfg    SubscriberConfig
	clock  Clock
	log    *zap.Logger
	m      replicaMetrics
	resync chan struct{}

	// Run's state.
	next     int64 // next sequence number expected; -1 before the first
	dupFloor int64 // lowest sequence number replay delivered last
	heard    bool  // a batch came on the PUB socket since this connection began
	batch    Batch
	decoder  Decoder
}

// NewSubscriber checks cfg. It starts nothing and connects nothing.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if _, err := checkEndpoint(cfg.Endpoint); err != nil {
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		if _, err := checkEndpoint(cfg.ReplayEndpoint); err != nil {
			return nil, err
		}
	}
	if cfg.Sink == nil {
		return nil, errors.New("kvevents: subscriber needs a Sink")
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = DefaultReplayTimeout
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.IdleReplay == 0 {
		cfg.IdleReplay = DefaultIdleReplay
	}
	s := &Subscriber{cfg: cfg, clock: cfg.Clock, log: cfg.Log, resync: make(chan struct{}, 1), next: -1}
	if s.clock == nil {
		s.clock = realClock{}
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.log = s.log.With(zap.String("pool", cfg.Pool), zap.String("replica", cfg.Replica))
	s.m = cfg.Metrics.replica(cfg.Pool, cfg.Replica)
	return s, nil
}

// Resync asks Run to drop the replica's entries and replay from the
// engine's first buffered batch, as after a restart. Safe to call from
// any goroutine; it does not wait.
func (s *Subscriber) Resync() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

// recvResult is one Recv of the SUB socket.
type recvResult struct {
	msg zmq4.Msg
	err error
}

// Run follows the replica's events until ctx is cancelled, reconnecting
// with backoff. It returns nil once ctx is done.
func (s *Subscriber) Run(ctx context.Context) error {
	backoff := s.cfg.MinBackoff
	failing := false
	for ctx.Err() == nil {
		sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout),
			zmq4.WithLogger(discardLogger()))
		err := sub.Dial(s.cfg.Endpoint)
		if err == nil {
			err = sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic)
		}
		if err != nil {
			_ = sub.Close()
			s.m.err("connect")
			if !failing {
				s.log.Warn("KV events: cannot connect; retrying with backoff", zap.String("endpoint", s.cfg.Endpoint), zap.Error(err))
				failing = true
			}
			select {
			case <-ctx.Done():
			case <-s.clock.After(backoff):
			}
			backoff = min(2*backoff, s.cfg.MaxBackoff)
			continue
		}
		if failing {
			s.log.Info("KV events: connected", zap.String("endpoint", s.cfg.Endpoint))
			failing = false
		}
		backoff = s.cfg.MinBackoff
		s.m.connects.Inc()
		s.follow(ctx, sub)
		_ = sub.Close()
	}
	return nil
}

// follow reads one connection until it fails or ctx is done.
func (s *Subscriber) follow(ctx context.Context, sub zmq4.Socket) {
	msgs := make(chan recvResult)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			msg, err := sub.Recv()
			select {
			case msgs <- recvResult{msg, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	s.heard = false
	// What was missed while not connected: everything buffered the first
	// time, what came after the last applied batch on a reconnect.
	s.catchUp(ctx, max(s.next, 0), -1)
	// One timer per idle period, not per message: heard says whether a
	// message came since it was armed.
	var idle <-chan time.Time
	heard := false
	if s.cfg.IdleReplay > 0 && s.cfg.ReplayEndpoint != "" {
		idle = s.clock.After(s.cfg.IdleReplay)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.resync:
			s.restart(ctx, "asked to resync")
		case <-idle:
			if !heard {
				s.catchUp(ctx, max(s.next, 0), -1)
			}
			heard = false
			idle = s.clock.After(s.cfg.IdleReplay)
		case r := <-msgs:
			heard = true
			if r.err != nil {
				s.m.err("disconnect")
				s.log.Info("KV events: connection lost; reconnecting", zap.Error(r.err))
				return
			}
			f := r.msg.Frames
			if len(f) != 3 || len(f[1]) != 8 {
				s.m.err("decode")
				continue // not a KV event message; changes nothing
			}
			s.deliver(ctx, int64(binary.BigEndian.Uint64(f[1])), f[2])
		}
	}
}

// maxLate is how far behind the next expected batch a batch may arrive on
// one connection and still be taken for a late copy, not for an engine
// that restarted its sequence numbers without the connection noticing.
const maxLate = 64

// deliver handles one batch from the PUB socket.
func (s *Subscriber) deliver(ctx context.Context, seq int64, payload []byte) {
	defer func() { s.heard = true }()
	switch {
	case seq < 0:
		s.m.err("decode")
	case s.next < 0 || seq == s.next:
		s.apply(seq, payload)
	case seq > s.next:
		s.m.gaps.Inc()
		s.catchUp(ctx, s.next, seq)
		if seq >= s.next { // replay did not deliver it: the sink was reset
			s.apply(seq, payload)
		}
	case seq >= s.dupFloor:
		// Already applied from a replay: the PUB socket's copy arriving
		// after it.
	case s.heard && s.next-seq <= maxLate:
		// Already applied, and older than the last replay: a batch the
		// publisher sent late, after ones that followed it. An engine that
		// restarts closes this connection first, so on a connection that
		// has delivered batches, a step back this small is lateness.
		s.m.err("late")
	default:
		s.restart(ctx, "sequence went back: engine restarted")
		if seq >= s.next {
			s.apply(seq, payload)
		}
	}
}

// restart drops the replica's entries and rebuilds from the engine's
// first buffered batch.
func (s *Subscriber) restart(ctx context.Context, why string) {
	s.resetSink(why)
	s.next = -1
	s.catchUp(ctx, 0, -1)
}

func (s *Subscriber) resetSink(why string) {
	s.m.resyncs.Inc()
	s.log.Warn("KV events: prefix index for this replica dropped and rebuilt from later events", zap.String("why", why))
	s.cfg.Sink.Reset()
}

// catchUp replays from sequence number from. until ≥ 0 is a sequence
// number known to exist (the PUB socket delivered it): the replay must
// reach it. It applies what replay returns, in order; when the batches
// from `from` on are not all there it resets the sink first (unless
// nothing was applied yet, where there is nothing to drop). It reports
// whether the sink is in step up to until (or to the engine's newest
// batch).
func (s *Subscriber) catchUp(ctx context.Context, from, until int64) bool {
	first := s.next < 0 // nothing applied yet: partial history is no loss
	replies, ok := s.replay(ctx, from)
	// From now on the PUB socket may repeat what replay delivered, from
	// `from` on, and nothing older: older is an engine restart.
	s.dupFloor = from
	if ok && len(replies) == 0 && until < 0 {
		return true // nothing missed
	}
	contiguous := ok && len(replies) > 0 && replies[0].seq == from
	for i := 1; contiguous && i < len(replies); i++ {
		contiguous = replies[i].seq == replies[i-1].seq+1
	}
	if contiguous && until >= 0 {
		contiguous = replies[len(replies)-1].seq+1 >= until
	}
	if !contiguous && !first {
		why := "replay could not close the gap"
		if s.cfg.ReplayEndpoint == "" {
			why = "events missed and no replay socket"
		}
		s.resetSink(why)
	}
	for _, r := range replies {
		if r.seq >= s.next || s.next < 0 || !contiguous {
			if !s.apply(r.seq, r.payload) {
				return false
			}
		}
	}
	return contiguous || first
}

// apply decodes and applies one batch. A batch that does not decode is a
// batch missed: the sink is reset.
func (s *Subscriber) apply(seq int64, payload []byte) bool {
	s.next = seq + 1
	if err := s.decoder.Decode(payload, &s.batch); err != nil {
		s.m.err("decode")
		s.resetSink("a batch did not decode")
		return false
	}
	for i := range s.batch.Events {
		s.cfg.Sink.Apply(&s.batch.Events[i])
	}
	s.m.events.Add(float64(len(s.batch.Events)))
	return true
}

type replayed struct {
	seq     int64
	payload []byte
}

// maxReplay bounds one replay's batches (vLLM buffers 10,000 by default).
const maxReplay = 1 << 20

// replay asks the replay socket for the batches from sequence number
// from on. ok is false when it could not get an answer ending in the end
// marker.
func (s *Subscriber) replay(ctx context.Context, from int64) (out []replayed, ok bool) {
	if s.cfg.ReplayEndpoint == "" {
		return nil, false
	}
	s.m.replays.Inc()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dealer := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout),
		zmq4.WithLogger(discardLogger()))
	defer dealer.Close()
	// A timeout closes the socket, which ends a Recv waiting on it.
	go func() {
		select {
		case <-ctx.Done():
		case <-s.clock.After(s.cfg.ReplayTimeout):
			s.m.err("replay_timeout")
		}
		_ = dealer.Close()
	}()
	if err := dealer.Dial(s.cfg.ReplayEndpoint); err != nil {
		s.m.err("replay")
		return nil, false
	}
	if err := dealer.SendMulti(zmq4.NewMsgFrom(nil, seqBytes(from))); err != nil {
		s.m.err("replay")
		return nil, false
	}
	for len(out) < maxReplay {
		msg, err := dealer.Recv()
		if err != nil {
			return out, false
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the empty delimiter
		}
		// vLLM ≥ 0.11 puts the topic first; earlier replies have none.
		if len(f) == 3 {
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			s.m.err("replay")
			return out, false
		}
		seq := int64(binary.BigEndian.Uint64(f[0]))
		if seq == -1 {
			return out, true
		}
		if seq < 0 || seq == math.MaxInt64 {
			return out, false
		}
		out = append(out, replayed{seq: seq, payload: f[1]})
	}
	return out, false
}
