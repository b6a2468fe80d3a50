// Package observe is what the router keeps and shows of the requests it
// serves, apart from serving them: each finished request's record (a ring
// read by /debug/requests, bench and the status page), every inter-token
// gap and queue time in latency sketches per replica (/debug/latency), the
// access log's common line written without zap, and the operators' status
// page. proxy hands it values — a Record, a Line, a gap, a view — as a
// request ends or a page is asked for; it reads nothing of proxy's.
package observe

import (
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// LogEncoderConfig is the configuration of the JSON log the access log's
// lines are written in (Options.AccessLog): zap's production encoder
// config with ISO8601 times. `gpurouter serve` builds its log with it, so
// the lines written here and those zap writes cannot drift apart
// (FuzzAccessLine).
func LogEncoderConfig() zapcore.EncoderConfig {
	c := zap.NewProductionEncoderConfig()
	c.EncodeTime = zapcore.ISO8601TimeEncoder
	return c
}

// AccessLog writes the common access log line — an exchange with no error
// to report and no migration, nearly every one — without zap: the same
// bytes zap's JSON encoder writes with LogEncoderConfig (the format of
// `gpurouter serve`'s log; FuzzAccessLine holds the two to it), at a
// fraction of its cost. zap spent ~2 µs a request encoding 17 generic
// fields, a twentieth of the router's CPU per request at c=64; this is
// appends into a pooled buffer. The other lines still go through the
// logger. A line's time is the exchange's end on the server's clock
// (Options.Now, time.Now by default), where zap reads its own clock a
// moment later. Its zero value is unset: every line goes through the
// logger.
type AccessLog struct {
	W     io.Writer // Options.AccessLog; nil: unset
	bufs  sync.Pool // *[]byte
	stamp stampCache
}

// Line is a request's access log line: what its exchange was,
// when it ended, and its times (ttft 0: no token came).
type Line struct {
	ID, Endpoint, Model, Replica, Arm, KeyID string
	Status                                   int
	Outcome                                  string
	Stream                                   bool
	Attempts                                 int
	TTFT, E2E                                time.Duration
	PromptTokens, CompletionTokens           int
	End                                      time.Time
}

// Write writes l; false when the writer is unset (the caller logs it
// through zap).
func (a *AccessLog) Write(l *Line) bool {
	if a.W == nil {
		return false
	}
	bp, _ := a.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	b := append((*bp)[:0], `{"level":"info","ts":"`...)
	b = a.stamp.append(b, l.End)
	b = append(b, `","msg":"request","request_id":"`...)
	b = appendJSONText(b, l.ID)
	b = append(b, `","endpoint":"`...)
	b = appendJSONText(b, l.Endpoint)
	b = append(b, `","model":"`...)
	b = appendJSONText(b, l.Model)
	b = append(b, `","replica":"`...)
	b = appendJSONText(b, l.Replica)
	b = append(b, `","arm":"`...)
	b = appendJSONText(b, l.Arm)
	if l.KeyID != "" {
		b = append(b, `","key_id":"`...)
		b = appendJSONText(b, l.KeyID)
	}
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(l.Status), 10)
	b = append(b, `,"outcome":"`...)
	b = append(b, l.Outcome...)
	b = append(b, `","stream":`...)
	b = strconv.AppendBool(b, l.Stream)
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(l.Attempts), 10)
	b = append(b, `,"ttft":`...)
	b = appendSeconds(b, l.TTFT)
	b = append(b, `,"e2e":`...)
	b = appendSeconds(b, l.E2E)
	b = append(b, `,"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(l.PromptTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(l.CompletionTokens), 10)
	b = append(b, "}\n"...)
	a.W.Write(b) //nolint:errcheck // as zap's: a log that can't be written is not the request's failure
	// A line grown by a client's 16 KiB X-Request-Id is not kept.
	if cap(b) <= maxPooledLine {
		*bp = b
		a.bufs.Put(bp)
	}
	return true
}

// stampCache writes a line's time as zap's ISO8601TimeEncoder does
// (layout 2006-01-02T15:04:05.000Z0700), formatting the date, the time to
// the second and the zone once a second: time.Format took ~200 ns of every
// line, a hundredth of a request's CPU at c=64. Its zero value is empty.
type stampCache struct {
	last atomic.Pointer[stamp]
}

// stamp is one second's formatted parts, immutable once stored.
type stamp struct {
	sec        int64
	loc        *time.Location
	secs, zone []byte // "2006-01-02T15:04:05", "Z0700"
}

func (c *stampCache) append(b []byte, t time.Time) []byte {
	st := c.last.Load()
	if st == nil || st.sec != t.Unix() || st.loc != t.Location() {
		st = &stamp{sec: t.Unix(), loc: t.Location(),
			secs: t.AppendFormat(nil, "2006-01-02T15:04:05"), zone: t.AppendFormat(nil, "Z0700")}
		c.last.Store(st)
	}
	ms := t.Nanosecond() / int(time.Millisecond)
	b = append(b, st.secs...)
	b = append(b, '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10))
	return append(b, st.zone...)
}

// maxPooledLine is the largest line buffer kept for the next line: a
// common line is ~350 bytes.
const maxPooledLine = 4 << 10

// appendSeconds is zap's SecondsDurationEncoder in its JSON encoder. A
// duration's seconds are always finite, so zap's NaN and ±Inf cases never
// apply.
func appendSeconds(b []byte, d time.Duration) []byte {
	return strconv.AppendFloat(b, float64(d)/float64(time.Second), 'f', -1, 64)
}

// appendJSONText appends s inside a JSON string as zap's JSON encoder
// escapes it: backslash and quote escaped, \n \r \t by name, other control
// bytes as \u00XX, each byte of invalid UTF-8 as \ufffd, the rest as is.
func appendJSONText(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '\\' && c != '"' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
		}
		b = append(b, s[start:i]...)
		switch {
		case c >= utf8.RuneSelf:
			b = append(b, `\ufffd`...)
		case c == '\\' || c == '"':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '\r':
			b = append(b, `\r`...)
		case c == '\t':
			b = append(b, `\t`...)
		default:
			b = append(b, `\u00`...)
			b = append(b, hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	return append(b, s[start:]...)
}
