package sim

import (
	"flag"
	"io"
	"testing"
)

func TestEngineFlags(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ef := RegisterEngineFlags(fs)
	err := fs.Parse([]string{"--max-num-seqs", "64", "--no-enable-prefix-caching", "--kv-cache-dtype=fp8",
		"--enable-chunked-prefill=false", "--max-num-batched-tokens", "32768", "--tensor-parallel-size", "2"})
	if err != nil {
		t.Fatal(err)
	}
	p := mustBuiltin(t, "llama3-8b-h100")
	if err := ef.Apply(&p); err != nil {
		t.Fatal(err)
	}
	e := p.Engine
	if e.MaxNumSeqs != 64 || e.EnablePrefixCaching || e.KVCacheDtype != "fp8" || e.EnableChunkedPrefill ||
		e.MaxNumBatchedTokens != 32768 || e.TensorParallelSize != 2 {
		t.Errorf("engine %+v", e)
	}
	if err := fs.Parse([]string{"--max-num-seqs", "many"}); err == nil {
		t.Error("bad value accepted")
	}
	if got, err := ParseFloatList("1, 1,0.5"); err != nil || len(got) != 3 || got[2] != 0.5 {
		t.Errorf("ParseFloatList = %v %v", got, err)
	}
	if _, err := ResolveProfile("no-such-profile"); err == nil {
		t.Error("unknown profile resolved")
	}
}
