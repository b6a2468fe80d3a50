package proxy

import (
	"context"
	"net"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
)

// The prefill step's acts on the goroutine path (handler.go: attempts),
// the only path that splits (disagg.go).

// prefillAdmitWatched is actPrefillAdmit: the request waits in the
// prefill step's queue until a prefill replica has room, it is shed, or
// the client leaves (watched on client).
func (s *Server) prefillAdmitWatched(f *flow, client net.Conn) (admission.Ticket, error) {
	actx, cancel := context.WithCancelCause(s.base)
	defer cancel(nil)
	w := s.startWatch(f.x, client, abortFunc(cancel))
	t, err := f.pd.sp.Admission.Admit(actx, f.prefillCost())
	w.stop()
	if err != nil && actx.Err() != nil {
		err = context.Cause(actx)
	}
	return t, err
}

// sendPrefill is actPrefill: the prefill request to f.rep, its whole
// answer read (within MaxResponseBytes), the client watched by w
// throughout — a client that leaves aborts the prefill, and the request
// ends there.
func (s *Server) sendPrefill(f *flow, w *clientWatch) act {
	ureq := s.upstreamRequest(f.ctx, f.x, f.pd.body)
	defer fasthttp.ReleaseRequest(ureq)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	_, cause, err := s.do(f, ureq, resp, w, false)
	if cause != nil {
		return f.abandon(cause)
	}
	if err != nil {
		return f.prefilled(0, nil, err)
	}
	buf := bytebufferpool.Get()
	defer bytebufferpool.Put(buf)
	if stream, ok := resp.BodyStream().(fasthttp.ReadCloserWithError); ok {
		w.retarget(abortFunc(func(e error) { stream.CloseWithError(e) })) //nolint:errcheck
		err = readAtMost(buf, stream, s.cfg.MaxResponseBytes+1)
		w.retarget(nil)
		if err == nil && buf.Len() > s.cfg.MaxResponseBytes {
			err = f.tooLarge()
		}
		stream.CloseWithError(err) //nolint:errcheck
	} else {
		buf.Set(resp.Body())
	}
	if cause := w.why(); cause != nil {
		return f.abandon(cause)
	}
	return f.prefilled(resp.StatusCode(), buf.B, err)
}
