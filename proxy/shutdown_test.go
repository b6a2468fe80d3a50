package proxy

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestShutdownLetsStreamsFinishWithinDrain(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.gap = 10, 20*time.Millisecond
	tr := startRouter(t, []string{up.url})
	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	<-up.received
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- tr.srv.Shutdown(ctx)
	}()
	evs := sseEvents(t, resp.Body)
	if len(evs) == 0 || evs[len(evs)-1] != "[DONE]" {
		t.Fatalf("stream cut during drain: %q", evs)
	}
	for _, e := range evs {
		if strings.Contains(e, `"error"`) {
			t.Fatalf("error event during a drain that had time: %s", e)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestShutdownEndsStreamsAfterDrainDeadline(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.gap = 100000, 10*time.Millisecond
	tr := startRouter(t, []string{up.url})
	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	<-up.received
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		done <- tr.srv.Shutdown(ctx)
	}()
	evs := sseEvents(t, resp.Body)
	if len(evs) < 2 || evs[len(evs)-1] != "[DONE]" || !strings.Contains(evs[len(evs)-2], `"code":"shutting_down"`) {
		t.Fatalf("stream after the drain deadline should end with a shutting_down error and [DONE]; got last events %q", evs[max(0, len(evs)-2):])
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "upstream abort", func() bool { return up.canceled.Load() == 1 })
	if tr.srv.Active() != 0 {
		t.Fatalf("%d requests still active", tr.srv.Active())
	}
}
