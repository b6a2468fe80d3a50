package proxy

import "github.com/valyala/fasthttp"

// clientHeaders are the request headers the router acts on, found in one
// pass over the client's headers. A lookup each (RequestHeader.Peek)
// copies and normalizes the name, then scans every header: about 0.1 µs,
// for the nine the router reads on every API request. The values are
// views of fasthttp's header buffer, valid as long as the request's
// context; the router reads them in steps 1–4 only. Its zero value is a
// request that sent none of them.
type clientHeaders struct {
	requestID, authorization, policy, session   []byte
	priority, tenant, timeout, sloTTFT, sloTPOT []byte
}

// readClientHeaders reads h's headers the router acts on: the first of
// each, as Peek finds it. Names are as fasthttp normalizes them (the
// server's default), so one comparison finds each whatever case the
// client wrote it in.
func readClientHeaders(h *fasthttp.RequestHeader) clientHeaders {
	var c clientHeaders
	var seen uint16 // by field, in the order below: a repeat after an empty first value is not the first
	for k, v := range h.All() {
		var p *[]byte
		var bit uint16
		switch string(k) {
		case "X-Request-Id":
			p, bit = &c.requestID, 1<<0
		case "Authorization":
			p, bit = &c.authorization, 1<<1
		case "X-Gpurouter-Policy":
			p, bit = &c.policy, 1<<2
		case "X-Session-Id":
			p, bit = &c.session, 1<<3
		case headerPriority:
			p, bit = &c.priority, 1<<4
		case headerTenant:
			p, bit = &c.tenant, 1<<5
		case headerTimeout:
			p, bit = &c.timeout, 1<<6
		case headerSLOTTFT:
			p, bit = &c.sloTTFT, 1<<7
		case headerSLOTPOT:
			p, bit = &c.sloTPOT, 1<<8
		default:
			continue
		}
		if seen&bit == 0 {
			seen |= bit
			*p = v
		}
	}
	return c
}
