package proxy

import (
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
)

// Request headers that give a request its own latency objectives, which
// the predictive policy picks a replica to meet (else the pool's defaults):
// a Go duration ("2s", "80ms") or plain seconds.
const (
	headerSLOTTFT = "X-Gpurouter-Slo-Ttft"
	headerSLOTPOT = "X-Gpurouter-Slo-Tpot"
)

// sloOf reads the request's SLO headers into its pick.
func sloOf(ctx *fasthttp.RequestCtx, pick *balancer.Request) error {
	if v := ctx.Request.Header.Peek(headerSLOTTFT); len(v) > 0 {
		d, err := parseTimeout(string(v))
		if err != nil {
			return badParam(headerSLOTTFT, err.Error())
		}
		pick.SLOTTFT = d
	}
	if v := ctx.Request.Header.Peek(headerSLOTPOT); len(v) > 0 {
		d, err := parseTimeout(string(v))
		if err != nil {
			return badParam(headerSLOTPOT, err.Error())
		}
		pick.SLOTPOT = d
	}
	return nil
}
