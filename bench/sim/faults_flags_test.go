package sim

import (
	"flag"
	"io"
	"reflect"
	"testing"
)

func TestFaultFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		base Faults // as decoded from --faults
		want Faults
	}{
		{"none given leaves the document alone", nil,
			Faults{ErrorRate: 0.1, RetryAfterSeconds: 9}, Faults{ErrorRate: 0.1, RetryAfterSeconds: 9}},
		{"every flag",
			[]string{"--close-after-response", "--close-lag", "250ms", "--timeout-keep-alive", "2.5", "--max-waiting-queue-length", "8",
				"--rate-limited", "--retry-after", "7", "--crash-every", "1m", "--crash-down", "1500ms"},
			Faults{},
			Faults{CloseAfterResponse: true, CloseLagSeconds: 0.25, KeepAliveTimeoutSeconds: 2.5, MaxWaitingQueueLength: 8, RateLimited: true,
				RetryAfterSeconds: 7, CrashEverySeconds: 60, CrashDownSeconds: 1.5}},
		{"a flag wins over the document, the rest stays",
			[]string{"--max-waiting-queue-length=4", "--retry-after=-1"},
			Faults{MaxWaitingQueueLength: 100, RetryAfterSeconds: 3, Hang: true},
			Faults{MaxWaitingQueueLength: 4, RetryAfterSeconds: -1, Hang: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("sim", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			ff := RegisterFaultFlags(fs)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			got := c.base
			ff.Apply(&got)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
			if err := got.validate(); err != nil {
				t.Errorf("flags made invalid faults: %v", err)
			}
		})
	}
}
