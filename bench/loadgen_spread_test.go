package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestRunSpreadsOverBaseURLs: with MoreBaseURLs, request i (and warm-up i)
// goes to server i mod n, as a Service in front of several routers would
// spread them, and every one is measured.
func TestRunSpreadsOverBaseURLs(t *testing.T) {
	ups := make([]*fakeUpstream, 3)
	for i := range ups {
		ups[i] = startUpstream(t, func(string) sseScript { return sseScript{tokens: 2} })
	}
	res, err := Run(context.Background(), Config{
		BaseURL: ups[0].url, MoreBaseURLs: []string{ups[1].url, ups[2].url + "/"},
		Model: "m", Requests: fixedRequests(9, 2), NumWarmups: 2, RequestIDPrefix: "s-", MaxConcurrency: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, rec := range res.Records {
		if !rec.OK() {
			t.Fatalf("%s: %s", rec.ID, rec.Error)
		}
		for j, up := range ups {
			got := up.log(rec.ID) != nil
			if want := i%len(ups) == j; got != want {
				t.Fatalf("request %d reached server %d: %v, want %v", i, j, got, want)
			}
		}
	}
	for i := range res.Warmups {
		if ups[i].log(fmt.Sprintf("s-warmup-%d", i)) == nil {
			t.Fatalf("warm-up %d did not reach server %d", i, i)
		}
	}
}

func TestConfigValidateEveryBaseURL(t *testing.T) {
	c := Config{BaseURL: "http://127.0.0.1:1", MoreBaseURLs: []string{"127.0.0.1:2"}, Model: "m", Requests: fixedRequests(1, 1)}
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), `"127.0.0.1:2"`) {
		t.Fatalf("err = %v, want the bad second base URL named", err)
	}
}
