package sim

import (
	"errors"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/kvevents"
)

// kvEventLog collects the KV-cache events of one engine step and publishes
// them as one batch at its end, as vLLM's scheduler publishes what its
// block pool queued during a step: BlockStored when blocks become full and
// cached, BlockRemoved when an allocation evicts a cache entry,
// AllBlocksCleared when the cache is dropped (a crash). Block hashes are
// the engine's own (seeded per replica, as vLLM's are per process); token
// ids are exactly those the blocks were hashed over, so a router keying
// blocks by their tokens (package prefixcache) matches them. The engine
// owns it (under the replica's mutex).
type kvEventLog struct {
	pub       *kvevents.Publisher
	blockSize int
	batch     kvevents.Batch
}

// stored records that blocks first…first+n−1 of s became cache entries.
func (l *kvEventLog) stored(s *seq, first, n int) {
	ev := kvevents.Event{Kind: kvevents.KindBlockStored, BlockSize: l.blockSize,
		Medium: kvevents.SomeString(kvevents.MediumGPU)}
	if first > 0 {
		ev.ParentHash, ev.HasParent = s.blockHash(first-1), true
	}
	for i := first; i < first+n; i++ {
		ev.BlockHashes = append(ev.BlockHashes, s.blockHash(i))
		for p := i * l.blockSize; p < (i+1)*l.blockSize; p++ {
			ev.TokenIDs = append(ev.TokenIDs, s.tokenAt(p))
		}
	}
	l.batch.Events = append(l.batch.Events, ev)
}

func (l *kvEventLog) removed(h uint64) {
	// Consecutive evictions share one event, as vLLM's would if it
	// batched them; one per block is what it sends today, and either
	// decodes the same.
	if n := len(l.batch.Events); n > 0 && l.batch.Events[n-1].Kind == kvevents.KindBlockRemoved {
		e := &l.batch.Events[n-1]
		e.BlockHashes = append(e.BlockHashes, h)
		return
	}
	l.batch.Events = append(l.batch.Events, kvevents.Event{Kind: kvevents.KindBlockRemoved,
		BlockHashes: []uint64{h}, Medium: kvevents.SomeString(kvevents.MediumGPU)})
}

func (l *kvEventLog) cleared() {
	l.batch.Events = append(l.batch.Events, kvevents.Event{Kind: kvevents.KindAllBlocksCleared})
}

// flush publishes what the step produced, if anything.
func (l *kvEventLog) flush(now time.Time) {
	if len(l.batch.Events) == 0 {
		return
	}
	l.batch.TS = float64(now.UnixNano()) / 1e9
	l.batch.DPRank = kvevents.Some(0)
	l.pub.Publish(&l.batch) // encodes now: the batch can be reused
	l.batch.Events = l.batch.Events[:0]
}

// genTokenBase marks the token ids the simulator reports for generated
// tokens in KV events: its output is not a real model's, and a follow-up
// turn that sends it back as text does not hit those blocks, on the
// simulator or in a router's index alike.
const genTokenBase = 1 << 31

// tokenAt is the token id at position p of s's context: the prompt's
// (when the engine keeps them for events), else a stand-in unique to s.
func (s *seq) tokenAt(p int) uint32 {
	if p < len(s.ids) {
		return s.ids[p]
	}
	return genTokenBase | uint32(mix64(s.salt, uint64(p))>>33)
}

// KVEventsConfig makes a replica publish its KV-cache events, as vLLM's
// --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
// "endpoint": …, "replay_endpoint": …, "topic": …}' does.
type KVEventsConfig struct {
	// Endpoint is where the PUB socket listens: tcp://HOST:PORT (vLLM's
	// default tcp://*:5557). In a fleet, replica i listens on PORT+i.
	Endpoint string
	// ReplayEndpoint is where the replay ROUTER socket listens; "" = none.
	// In a fleet, replica i listens on PORT+i.
	ReplayEndpoint string
	// Topic is every message's first frame (vLLM's default "").
	Topic string
	// Encoding: kvevents.EncodingArray (vLLM ≤ 0.23) or EncodingMap (0.24+).
	Encoding kvevents.Encoding
	// BufferSteps is how many batches replay can serve; 0 = 10,000.
	BufferSteps int
}

// forReplica is the config of replica i of a fleet: ports offset by i
// (port 0, any free port, stays 0).
func (c KVEventsConfig) forReplica(i int) (KVEventsConfig, error) {
	offset := func(ep string) (string, error) {
		if ep == "" || strings.HasSuffix(ep, ":0") {
			return ep, nil
		}
		return kvevents.OffsetPort(ep, i)
	}
	var err error
	if c.Endpoint, err = offset(c.Endpoint); err != nil {
		return c, err
	}
	c.ReplayEndpoint, err = offset(c.ReplayEndpoint)
	return c, err
}

// setupKVEvents builds the replica's publisher (bound by Listen, run by
// Run) and hooks the engine's cache to it.
func (r *Replica) setupKVEvents(c KVEventsConfig) error {
	if !r.cfg.Profile.Engine.EnablePrefixCaching {
		return errKVEventsNeedCaching
	}
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x6b76+uint64(r.cfg.Index)))
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: c.Endpoint, ReplayEndpoint: c.ReplayEndpoint,
		Topic: c.Topic, Encoding: c.Encoding, BufferSteps: c.BufferSteps,
		// Called from the publisher's goroutine only: rng is its own.
		Fault: func(uint64) kvevents.Fault {
			f := r.faults.Load()
			switch x := rng.Float64(); {
			case x < f.KVEventsLoseRate:
				return kvevents.FaultLose
			case x < f.KVEventsLoseRate+f.KVEventsDropRate:
				return kvevents.FaultDrop
			case x < f.KVEventsLoseRate+f.KVEventsDropRate+f.KVEventsReorderRate:
				return kvevents.FaultDelay
			}
			return kvevents.FaultNone
		}})
	if err != nil {
		return err
	}
	r.pub = pub
	log := &kvEventLog{pub: pub, blockSize: r.d.blockSize}
	r.eng.events = log
	r.eng.kv.evicted = log.removed
	return nil
}

var errKVEventsNeedCaching = errors.New("KV events need prefix caching (--enable-prefix-caching)")

// KVEventsAddr is the replica's KV event PUB endpoint, and its replay
// endpoint, once bound ("" when off).
func (r *Replica) KVEventsAddr() (pub, replay string) {
	if r.pub == nil {
		return "", ""
	}
	return r.pub.Addr(), r.pub.ReplayAddr()
}
