package proxy

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/gpurouter/gpurouter/proxy/observe"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// fixedClock is a zap clock stopped at one instant.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time                         { return c.t }
func (c fixedClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

// serveLogger is `gpurouter serve`'s JSON logger (cmd/gpurouter:
// newLoggerSync) writing to w, its clock stopped at t.
func serveLogger(w io.Writer, t time.Time) *zap.Logger {
	enc := zapcore.NewJSONEncoder(observe.LogEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), zap.InfoLevel), zap.WithClock(fixedClock{t}))
}

// accessLines is x's access log line written by observe.AccessLog and by zap.
func accessLines(x *exchange, err error, end time.Time, model, replica string, e2e time.Duration) (fast, slow string) {
	var fb, sb bytes.Buffer
	x.s = &Server{access: observe.AccessLog{W: &fb}, log: zap.NewNop()}
	x.s.accessFields.New = func() any { return new(accessFields) }
	x.logLine(err, end, x.received.Add(e2e), model, replica)
	x.s = &Server{log: serveLogger(&sb, end)}
	x.s.accessFields.New = func() any { return new(accessFields) }
	x.logLine(err, end, x.received.Add(e2e), model, replica)
	return fb.String(), sb.String()
}

// FuzzAccessLine holds observe.AccessLog to zap, byte for byte: the line it writes
// is the line `gpurouter serve`'s logger writes for the same exchange.
func FuzzAccessLine(f *testing.F) {
	f.Add("gr-1x2y3z-1", "m", "r0", "", "", 200, uint8(0), uint8(0), false, 1, int64(1_234_567), int64(2_345_678), 60, 64, int64(1_795_000_000_123_456_789), uint8(0))
	f.Add("id \"q\" \\ \n\r\t\x00\x1f\x7f", "mödel ☃", "r\xff\xfe", "arm\u2028\u2029", "key-1", 429, uint8(4), uint8(2), true, 3, int64(-5), int64(0), 0, -1, int64(-1), uint8(1))
	f.Add("\xc3", "\xe2\x82", "", "<&>", "k\"", 0, uint8(255), uint8(7), true, 0, int64(1<<62), int64(-1<<62), 1<<40, 7, int64(0), uint8(2))
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+1800), time.FixedZone("", -7*3600), time.Local}
	f.Fuzz(func(t *testing.T, id, model, replica, arm, keyID string, status int, oc, ep uint8, stream bool, attempts int,
		ttftNs, e2eNs int64, prompt, completion int, atNs int64, zone uint8) {
		x := &exchange{id: id, arm: arm, status: int32(status), attempts: int32(attempts), promptTokens: int32(prompt), completionTokens: int32(completion),
			outcome: outcome(int(oc) % len(outcomeNames)), ep: openai.Endpoint(ep % 4)}
		x.principal.ID = keyID
		x.req.Stream = stream
		x.received = time.Unix(0, atNs).In(zones[int(zone)%len(zones)])
		if ttftNs != 0 {
			x.firstTok = x.received.Add(time.Duration(ttftNs))
		}
		end := x.received.Add(time.Duration(e2eNs) / 2)
		fast, slow := accessLines(x, nil, end, model, replica, time.Duration(e2eNs))
		if fast != slow {
			t.Fatalf("accessLog wrote\n%s\nzap writes\n%s", fast, slow)
		}
	})
}

// The lines observe.AccessLog leaves to zap: a failure's, a migrated stream's.
func TestAccessLogLeavesTheRestToZap(t *testing.T) {
	at := time.Date(2026, 11, 27, 1, 2, 3, 456_000_000, time.UTC)
	x := &exchange{id: "gr-1", ep: openai.Chat, status: 502, outcome: outcomeUpstreamError, attempts: 2, received: at}
	fast, slow := accessLines(x, errors.New("replica r0: connection reset"), at.Add(time.Second), "m", "r0", time.Second)
	if fast != "" || slow == "" || !bytes.Contains([]byte(slow), []byte(`"error":"replica r0: connection reset"`)) {
		t.Fatalf("a failure: accessLog wrote %q, zap %q", fast, slow)
	}
	x = &exchange{id: "gr-2", ep: openai.Chat, status: 200, outcome: outcomeMigrated, received: at,
		mig: &migration{migrations: 1}}
	fast, slow = accessLines(x, nil, at.Add(time.Second), "m", "r1", time.Second)
	if fast != "" || !bytes.Contains([]byte(slow), []byte(`"migration":{"count":1`)) {
		t.Fatalf("a migrated stream: accessLog wrote %q, zap %q", fast, slow)
	}
	x = &exchange{id: "gr-3", ep: openai.Chat, status: 200, outcome: outcomeOK, received: at}
	fast, slow = accessLines(x, nil, at.Add(time.Second), "m", "r0", time.Second)
	const want = `{"level":"info","ts":"2026-11-27T01:02:04.456Z","msg":"request","request_id":"gr-3","endpoint":"chat","model":"m","replica":"r0","arm":"","status":200,"outcome":"ok","stream":false,"attempts":0,"ttft":0,"e2e":1,"prompt_tokens":0,"completion_tokens":0}` + "\n"
	if fast != want || slow != want {
		t.Fatalf("the common line:\naccessLog %s\nzap       %s\nwant      %s", fast, slow, want)
	}
}

// BenchmarkAccessLine is one common access log line: written by the proxy
// (as `gpurouter serve` has it), and by zap.
func BenchmarkAccessLine(b *testing.B) {
	at := time.Now()
	x := &exchange{id: "gr-1x2y3z4w5v-12345", ep: openai.Chat, arm: "least_loaded", status: 200, outcome: outcomeOK, attempts: 1,
		received: at, firstTok: at.Add(1234567), promptTokens: 60, completionTokens: 64}
	end := at.Add(2345678)
	for _, tt := range []struct {
		name   string
		access io.Writer
	}{{"proxy", io.Discard}, {"zap", nil}} {
		b.Run(tt.name, func(b *testing.B) {
			x.s = &Server{access: observe.AccessLog{W: tt.access}, log: serveLogger(io.Discard, end)}
			x.s.accessFields.New = func() any { return new(accessFields) }
			b.ReportAllocs()
			for b.Loop() {
				x.logLine(nil, end, end, "meta-llama/Llama-3.1-8B-Instruct", "vllm-0")
			}
		})
	}
}
