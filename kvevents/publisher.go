package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
)

// Fault is what a publisher does with one batch, for fault injection.
type Fault uint8

// The faults. FaultNone sends the batch.
const (
	FaultNone Fault = iota
	// FaultDrop does not send the batch on the PUB socket but keeps it for
	// replay: a message lost on the way, which a subscriber can recover.
	FaultDrop
	// FaultLose neither sends nor keeps it: a gap replay cannot close.
	FaultLose
	// FaultDelay sends the batch after the next one: reordered.
	FaultDelay
)

// PublisherConfig configures a Publisher. Endpoint is required.
type PublisherConfig struct {
	// Endpoint is where the PUB socket listens, tcp://HOST:PORT (port 0:
	// any free port; Addr says which).
	Endpoint string
	// ReplayEndpoint is where the ROUTER socket answering replay requests
	// listens; "" = no replay socket.
	ReplayEndpoint string
	// Topic is the first frame of every message ("" as vLLM's default).
	Topic string
	// Encoding lays out the events (EncodingArray: vLLM ≤ 0.23).
	Encoding Encoding
	// BufferSteps is how many recent batches replay can serve; 0 = 10,000
	// (vLLM's buffer_steps).
	BufferSteps int
	// QueueSize bounds the batches waiting to be sent; past it Publish
	// drops (Dropped counts them), so a stalled socket never blocks the
	// engine, as a ZMQ high-water mark does. 0 = 4,096.
	QueueSize int
	// Fault, when set, is asked about every batch, by sequence number.
	// It is called from Run's goroutine.
	Fault func(seq uint64) Fault
}

// Publisher publishes KV event batches as vLLM's ZmqEventPublisher does:
// each message three frames (topic, 8-byte big-endian sequence number,
// msgpack batch) on a PUB socket, and a ROUTER socket that answers a
// request [empty, start sequence] with every buffered batch from that
// sequence on, [empty, topic, seq, batch] each, then [empty, empty, −1,
// empty]. The simulator uses it; Subscriber reads it. Build with
// NewPublisher, bind with Listen, serve with Run; Publish is safe for
// concurrent use.
type Publisher struct {
	cfg   PublisherConfig
	queue chan []byte

	mu     sync.Mutex // guards the fields below
	pub    zmq4.Socket
	replay zmq4.Socket
	buf    []stored // ring of the last BufferSteps batches
	oldest int      // index of the oldest in buf once it is full
	next   uint64

	dropped atomic.Int64
	closed  atomic.Bool
}

type stored struct {
	seq     uint64
	payload []byte
}

// NewPublisher checks cfg. It starts and binds nothing.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if _, err := checkEndpoint(cfg.Endpoint); err != nil {
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		if _, err := checkEndpoint(cfg.ReplayEndpoint); err != nil {
			return nil, err
		}
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = 10_000
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 4096
	}
	return &Publisher{cfg: cfg, queue: make(chan []byte, cfg.QueueSize)}, nil
}

// Listen binds the sockets (Run does it if it has not been done). On
// error nothing stays bound.
func (p *Publisher) Listen() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pub != nil {
		return nil
	}
	// The sockets live until Close, not a context: Run closes them.
	pub := zmq4.NewPub(context.Background(), zmq4.WithLogger(discardLogger()))
	if err := pub.Listen(p.cfg.Endpoint); err != nil {
		_ = pub.Close()
		return err
	}
	if err := pub.SetOption(zmq4.OptionHWM, 100_000); err != nil {
		_ = pub.Close()
		return err
	}
	var rep zmq4.Socket
	if p.cfg.ReplayEndpoint != "" {
		rep = zmq4.NewRouter(context.Background(), zmq4.WithLogger(discardLogger()))
		if err := rep.Listen(p.cfg.ReplayEndpoint); err != nil {
			_ = pub.Close()
			_ = rep.Close()
			return err
		}
	}
	p.pub, p.replay = pub, rep
	return nil
}

// Addr is the PUB socket's endpoint after Listen (the port resolved).
func (p *Publisher) Addr() string { return p.addr(func() zmq4.Socket { return p.pub }) }

// ReplayAddr is the replay socket's endpoint after Listen ("" without one).
func (p *Publisher) ReplayAddr() string { return p.addr(func() zmq4.Socket { return p.replay }) }

func (p *Publisher) addr(get func() zmq4.Socket) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := get(); s != nil && s.Addr() != nil {
		return "tcp://" + s.Addr().String()
	}
	return ""
}

// Dropped is how many batches Publish dropped because the queue was full.
func (p *Publisher) Dropped() int64 { return p.dropped.Load() }

// Publish queues a batch; it never blocks. The batch is encoded now, so
// the caller may reuse it at once.
func (p *Publisher) Publish(b *Batch) {
	if p.closed.Load() {
		return
	}
	payload := AppendBatch(nil, b, p.cfg.Encoding)
	select {
	case p.queue <- payload:
	default:
		p.dropped.Add(1)
	}
}

// Run sends queued batches and answers replay requests until ctx is
// cancelled, then closes the sockets. It binds them first if Listen was
// not called. Run may be called once.
func (p *Publisher) Run(ctx context.Context) error {
	if err := p.Listen(); err != nil {
		return err
	}
	p.mu.Lock()
	pub, rep := p.pub, p.replay
	p.mu.Unlock()
	var wg sync.WaitGroup
	if rep != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.serveReplay(rep)
		}()
	}
	topic := []byte(p.cfg.Topic)
	var held *stored // a batch delayed by FaultDelay
	send := func(s stored) {
		_ = pub.SendMulti(zmq4.NewMsgFrom(topic, seqBytes(int64(s.seq)), s.payload))
	}
	for {
		select {
		case <-ctx.Done():
			p.closed.Store(true)
			_ = pub.Close()
			if rep != nil {
				_ = rep.Close()
			}
			wg.Wait()
			return nil
		case payload := <-p.queue:
			p.mu.Lock()
			s := stored{seq: p.next, payload: payload}
			p.next++
			fault := FaultNone
			if p.cfg.Fault != nil {
				fault = p.cfg.Fault(s.seq)
			}
			if fault != FaultLose {
				if len(p.buf) < p.cfg.BufferSteps {
					p.buf = append(p.buf, s)
				} else {
					p.buf[p.oldest] = s
					p.oldest = (p.oldest + 1) % len(p.buf)
				}
			}
			p.mu.Unlock()
			switch fault {
			case FaultNone:
				send(s)
			case FaultDelay:
				if held == nil {
					held = &s
					continue
				}
				send(s)
			}
			if held != nil && held.seq != s.seq {
				send(*held)
				held = nil
			}
		}
	}
}

// serveReplay answers replay requests until the socket is closed.
func (p *Publisher) serveReplay(rep zmq4.Socket) {
	topic := []byte(p.cfg.Topic)
	for {
		msg, err := rep.Recv()
		if err != nil {
			if errors.Is(err, context.Canceled) || p.closed.Load() {
				return
			}
			continue
		}
		// [identity, empty, start]: anything else is not a replay request.
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var out []stored
		for i := range p.buf {
			if s := p.buf[(p.oldest+i)%len(p.buf)]; s.seq >= start {
				out = append(out, s)
			}
		}
		p.mu.Unlock()
		for _, s := range out {
			_ = rep.SendMulti(zmq4.NewMsgFrom(id, nil, topic, seqBytes(int64(s.seq)), s.payload))
		}
		_ = rep.SendMulti(zmq4.NewMsgFrom(id, nil, nil, seqBytes(-1), nil))
	}
}

func seqBytes(seq int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }
