package proxy

import (
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/openai"
)

// Request headers that give a request its own latency objectives, which
// the predictive policy picks a replica to meet (else the pool's defaults):
// a Go duration ("2s", "80ms") or plain seconds.
const (
	headerSLOTTFT = "X-Gpurouter-Slo-Ttft"
	headerSLOTPOT = "X-Gpurouter-Slo-Tpot"
)

// sloOf reads the request's SLO headers into its pick.
func sloOf(hdr *clientHeaders, pick *balancer.Request) error {
	if v := hdr.sloTTFT; len(v) > 0 {
		d, err := parseTimeout(string(v))
		if err != nil {
			return openai.BadParam(headerSLOTTFT, err.Error())
		}
		pick.SLOTTFT = d
	}
	if v := hdr.sloTPOT; len(v) > 0 {
		d, err := parseTimeout(string(v))
		if err != nil {
			return openai.BadParam(headerSLOTPOT, err.Error())
		}
		pick.SLOTPOT = d
	}
	return nil
}
