package bench

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkLoadGenEvents streams b.N output events through the load
// generator from a trivial loopback upstream (which shares the CPU), spread
// over a number of concurrent streams. ns/op and allocs/op are per event;
// events/s is the client's sustained rate.
func BenchmarkLoadGenEvents(b *testing.B) {
	cases := []struct {
		streams, batch int
	}{
		{200, 1},   // one event per write: a syscall per event on both sides
		{200, 16},  // events arrive 16 at a time: the client's parsing cost
		{2000, 1},  // many concurrent streams
		{2000, 16}, // many streams, parsing-bound
	}
	for _, bc := range cases {
		b.Run(fmt.Sprintf("streams=%d/events-per-write=%d", bc.streams, bc.batch), func(b *testing.B) {
			perStream := max(b.N/bc.streams, 1)
			up := startUpstream(b, func(string) sseScript {
				return sseScript{tokens: perStream, batch: bc.batch, noLog: true}
			})
			cfg := Config{BaseURL: up.url, Model: "m", Requests: fixedRequests(bc.streams, perStream)}
			b.ReportAllocs()
			b.ResetTimer()
			res, err := Run(context.Background(), cfg)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			events := 0
			for _, rec := range res.Records {
				if !rec.OK() {
					b.Fatalf("%s: %s", rec.ID, rec.Error)
				}
				events += rec.Chunks
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64(res.MaxInFlight), "max-streams")
		})
	}
}
