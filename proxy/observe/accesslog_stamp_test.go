package observe

import (
	"testing"
	"time"
)

// The time a line carries, from one cache across lines: the same second
// (a hit), the next, another zone in the same second, before 1970.
func TestAccessLogStampMatchesFormat(t *testing.T) {
	var c stampCache
	base := time.Date(2026, 11, 27, 23, 59, 59, 0, time.UTC)
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+1800), time.FixedZone("", -7*3600), time.Local}
	var times []time.Time
	for _, d := range []time.Duration{0, 7 * time.Millisecond, 999_999_999, time.Second, time.Second + 10*time.Millisecond, 36 * time.Hour} {
		for _, z := range zones {
			times = append(times, base.Add(d).In(z))
		}
	}
	times = append(times, time.Unix(-1, 5_000_000).UTC(), time.Unix(-1, 995_000_000).UTC(), time.Unix(0, 0).UTC())
	for _, at := range times {
		got := string(c.append([]byte("x"), at))
		if want := "x" + at.Format("2006-01-02T15:04:05.000Z0700"); got != want {
			t.Errorf("%v: %q; want %q", at, got, want)
		}
	}
}
