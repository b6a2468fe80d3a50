package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.msgpack from the encoder")

// goldenBatch has one of everything the wire carries: a hash above
// math.MaxInt64 (uint64 on the wire), token ids in every integer width,
// the optional trailing fields of newer vLLM, a removal and a clear.
func goldenBatch() *Batch {
	return &Batch{
		TS: 1700000000.5,
		Events: []Event{
			{Kind: KindBlockStored, BlockHashes: []uint64{0xF0E1D2C3B4A59687, 42}, ParentHash: 7, HasParent: true,
				TokenIDs: []uint32{1, 200, 70000, 100264, 5, 6, 7, 8}, BlockSize: 4, Medium: SomeString(MediumGPU)},
			{Kind: KindBlockStored, BlockHashes: []uint64{9}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4,
				Medium: SomeString(MediumGPU), ExtraKeys: [][]byte{{0xc0}}, ExtraKeysSet: true,
				GroupIdx: Some(0), SpecKind: SomeString("full_attention")},
			{Kind: KindBlockRemoved, BlockHashes: []uint64{42}, Medium: SomeString(MediumGPU)},
			{Kind: KindAllBlocksCleared},
		},
		DPRank: Some(0),
	}
}

// Hand-written expectations, from vLLM's field order
// (vllm/distributed/kv_events.py) and msgpack's spec, not from the encoder.

func fixstr(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func hx(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

var (
	// float64 1700000000.5
	wantTS     = hx("cb41d954fc40200000")
	wantHashes = hx("92cff0e1d2c3b4a596872a")
	// [1, 200, 70000, 100264, 5, 6, 7, 8]: fixint, uint8, uint32, uint32, fixints
	wantTokens  = hx("9801ccc8ce00011170ce000187a805060708")
	wantTokens2 = hx("9401020304")
)

func handArrayBatch() []byte {
	stored1 := cat(hx("98"), fixstr("BlockStored"), wantHashes, hx("07"), wantTokens, hx("04"), hx("c0"), fixstr("GPU"), hx("c0"))
	// extra_keys [None], group_idx 0, kv_cache_spec_kind; the sliding
	// window (None, trailing) is omitted.
	stored2 := cat(hx("9b"), fixstr("BlockStored"), hx("9109"), hx("c0"), wantTokens2, hx("04"), hx("c0"), fixstr("GPU"), hx("c0"),
		hx("91c0"), hx("00"), fixstr("full_attention"))
	removed := cat(hx("93"), fixstr("BlockRemoved"), hx("912a"), fixstr("GPU"))
	cleared := cat(hx("91"), fixstr("AllBlocksCleared"))
	return cat(hx("93"), wantTS, hx("94"), stored1, stored2, removed, cleared, hx("00"))
}

func handMapEvents() []byte {
	stored1 := cat(hx("88"), fixstr("type"), fixstr("BlockStored"),
		fixstr("block_hashes"), wantHashes, fixstr("parent_block_hash"), hx("07"), fixstr("token_ids"), wantTokens,
		fixstr("block_size"), hx("04"), fixstr("lora_id"), hx("c0"), fixstr("medium"), fixstr("GPU"), fixstr("lora_name"), hx("c0"))
	stored2 := cat(hx("8b"), fixstr("type"), fixstr("BlockStored"),
		fixstr("block_hashes"), hx("9109"), fixstr("parent_block_hash"), hx("c0"), fixstr("token_ids"), wantTokens2,
		fixstr("block_size"), hx("04"), fixstr("lora_id"), hx("c0"), fixstr("medium"), fixstr("GPU"), fixstr("lora_name"), hx("c0"),
		fixstr("extra_keys"), hx("91c0"), fixstr("group_idx"), hx("00"), fixstr("kv_cache_spec_kind"), fixstr("full_attention"))
	removed := cat(hx("83"), fixstr("type"), fixstr("BlockRemoved"), fixstr("block_hashes"), hx("912a"), fixstr("medium"), fixstr("GPU"))
	cleared := cat(hx("81"), fixstr("type"), fixstr("AllBlocksCleared"))
	return cat(hx("94"), stored1, stored2, removed, cleared)
}

func handMapBatch() []byte { return cat(hx("93"), wantTS, handMapEvents(), hx("00")) }

// handMapEnvelope is the map-shaped batch a later vLLM may send
// (EventBatch without array_like), keys in another order.
func handMapEnvelope() []byte {
	return cat(hx("83"), fixstr("data_parallel_rank"), hx("00"), fixstr("events"), handMapEvents(), fixstr("ts"), wantTS)
}

func TestGoldenEncodings(t *testing.T) {
	for _, tc := range []struct {
		name string
		enc  Encoding
		hand []byte
	}{
		{"array", EncodingArray, handArrayBatch()},
		{"map", EncodingMap, handMapBatch()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := AppendBatch(nil, goldenBatch(), tc.enc)
			if !bytes.Equal(got, tc.hand) {
				t.Fatalf("encoder disagrees with the hand-written bytes\n got %x\nwant %x", got, tc.hand)
			}
			path := filepath.Join("testdata", "batch_"+tc.name+".msgpack")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			file, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(file, got) {
				t.Fatalf("%s differs from the encoder's output (go test -run Golden -update rewrites it)", path)
			}
		})
	}
}

func TestDecodeBothEncodingsAlike(t *testing.T) {
	want := goldenBatch()
	for _, tc := range []struct {
		name    string
		payload []byte
	}{
		{"array file", readFile(t, "batch_array.msgpack")},
		{"map file", readFile(t, "batch_map.msgpack")},
		{"map envelope", handMapEnvelope()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got Batch
			if err := DecodeBatch(tc.payload, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(&got, want) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, *want)
			}
		})
	}
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeHashForms: the three ways a block hash has travelled read as
// one key each, as vLLM's own int conversion would give.
func TestDecodeHashForms(t *testing.T) {
	digest := hx("00112233445566778899aabbccddeeff0011223344556677f0e1d2c3b4a59687")
	for _, tc := range []struct {
		name string
		hash []byte
		want uint64
	}{
		{"uint64", hx("cff0e1d2c3b4a59687"), 0xF0E1D2C3B4A59687},
		{"negative int64 (Python hash())", hx("d3f0e1d2c3b4a59687"), 0xF0E1D2C3B4A59687},
		{"negative fixint", hx("ff"), 0xFFFFFFFFFFFFFFFF},
		{"sha256 bytes", cat(hx("c420"), digest), 0xF0E1D2C3B4A59687},
		{"short bytes", hx("c4020102"), 0x0102},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload := cat(hx("92"), wantTS, hx("91"), hx("93"), fixstr("BlockRemoved"), hx("91"), tc.hash, hx("c0"))
			var b Batch
			if err := DecodeBatch(payload, &b); err != nil {
				t.Fatal(err)
			}
			if got := b.Events[0].BlockHashes[0]; got != tc.want {
				t.Fatalf("key %#x, want %#x", got, tc.want)
			}
			if b.DPRank.Set {
				t.Fatal("a two-element batch has no dp rank")
			}
		})
	}
}

func TestDecodeForwardCompatible(t *testing.T) {
	// An event type from the future, an unknown map key and an extra
	// trailing array field are skipped; the known events still come out.
	future := cat(hx("92"), fixstr("BlockPinned"), hx("9101"))
	removed := cat(hx("84"), fixstr("type"), fixstr("BlockRemoved"), fixstr("block_hashes"), hx("912a"),
		fixstr("medium"), fixstr("GPU"), fixstr("tier_hint"), hx("92c3c2"))
	cleared := cat(hx("92"), fixstr("AllBlocksCleared"), hx("81a178d70100000000000000ff"))
	payload := cat(hx("93"), wantTS, hx("93"), future, removed, cleared, hx("03"))
	var b Batch
	if err := DecodeBatch(payload, &b); err != nil {
		t.Fatal(err)
	}
	kinds := []Kind{b.Events[0].Kind, b.Events[1].Kind, b.Events[2].Kind}
	if !reflect.DeepEqual(kinds, []Kind{KindUnknown, KindBlockRemoved, KindAllBlocksCleared}) || b.DPRank != Some(3) {
		t.Fatalf("kinds %v rank %+v", kinds, b.DPRank)
	}
}

func TestDecodeMalformed(t *testing.T) {
	good := handArrayBatch()
	for _, tc := range []struct {
		name    string
		payload []byte
	}{
		{"empty", nil},
		{"not a batch", hx("c3")},
		{"truncated", good[:len(good)-3]},
		{"trailing bytes", append(append([]byte(nil), good...), 0x00)},
		{"huge array header", hx("92cb41d954fc40200000dd7fffffff")},
		{"map without events", cat(hx("81"), fixstr("ts"), wantTS)},
		{"event map without type", cat(hx("92"), wantTS, hx("9181"), fixstr("medium"), hx("c0"))},
		{"token id not an int", cat(hx("92"), wantTS, hx("91"), hx("95"), fixstr("BlockStored"), hx("9101"), hx("c0"), hx("91a178"), hx("01"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			if err := DecodeBatch(tc.payload, &b); !errors.Is(err, ErrMalformed) {
				t.Fatalf("err %v, want ErrMalformed", err)
			}
		})
	}
}

// TestDecodeStoredWithoutMatchingTokens: a store whose tokens don't split
// into its blocks can't be keyed by content, so it is not a store.
func TestDecodeStoredWithoutMatchingTokens(t *testing.T) {
	stored := cat(hx("95"), fixstr("BlockStored"), hx("920102"), hx("c0"), hx("93010203"), hx("02"))
	var b Batch
	if err := DecodeBatch(cat(hx("92"), wantTS, hx("91"), stored), &b); err != nil {
		t.Fatal(err)
	}
	if b.Events[0].Kind != KindUnknown {
		t.Fatalf("kind %v", b.Events[0].Kind)
	}
}

func TestDecodeReusesStorage(t *testing.T) {
	payload := handArrayBatch()
	var b Batch
	var d Decoder
	if err := d.Decode(payload, &b); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := d.Decode(payload, &b); err != nil {
			t.Fatal(err)
		}
	})
	// The full_attention spec string is the one allocation left.
	if allocs > 1 {
		t.Fatalf("%v allocations per decode into a used Batch", allocs)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(handArrayBatch())
	f.Add(handMapBatch())
	f.Add(handMapEnvelope())
	f.Add(hx("92cb41d954fc40200000dd7fffffff"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		var b Batch
		if DecodeBatch(payload, &b) != nil {
			return
		}
		for _, e := range b.Events {
			if e.Kind == KindUnknown {
				return // not re-encodable: its fields are gone
			}
		}
		// What decodes re-encodes and decodes to the same events, in
		// either encoding.
		for _, enc := range []Encoding{EncodingArray, EncodingMap} {
			var again Batch
			if err := DecodeBatch(AppendBatch(nil, &b, enc), &again); err != nil {
				t.Fatalf("%v: re-encoded batch does not decode: %v", enc, err)
			}
			if !sameEvents(&b, &again) {
				t.Fatalf("%v: round trip changed the batch\n%+v\n%+v", enc, b, again)
			}
		}
	})
}

func sameEvents(a, b *Batch) bool {
	if len(a.Events) != len(b.Events) || a.DPRank != b.DPRank {
		return false
	}
	for i := range a.Events {
		x, y := a.Events[i], b.Events[i]
		if x.Kind != y.Kind || !reflect.DeepEqual(x.BlockHashes, y.BlockHashes) || x.ParentHash != y.ParentHash ||
			x.HasParent != y.HasParent || len(x.TokenIDs) != len(y.TokenIDs) || x.GroupIdx != y.GroupIdx ||
			x.Medium != y.Medium || x.LoraName != y.LoraName || x.ExtraKeysSet != y.ExtraKeysSet {
			return false
		}
	}
	return true
}

// benchBatch is a busy engine step's worth of events: 8 stores of 16
// blocks of 16 tokens (hashes above math.MaxInt64, as vLLM's sha256-derived
// keys mostly are) and 4 removals of 16 blocks.
func benchBatch() *Batch {
	b := &Batch{TS: 1700000000.5, DPRank: Some(0)}
	h := uint64(0x9E3779B97F4A7C15)
	for i := 0; i < 8; i++ {
		e := Event{Kind: KindBlockStored, BlockSize: 16, Medium: SomeString(MediumGPU), ParentHash: h, HasParent: i > 0}
		for j := 0; j < 16; j++ {
			h = h*0x100000001B3 | 1<<63
			e.BlockHashes = append(e.BlockHashes, h)
			for k := 0; k < 16; k++ {
				e.TokenIDs = append(e.TokenIDs, uint32((i*4099+j*257+k*31)%151000))
			}
		}
		b.Events = append(b.Events, e)
	}
	for i := 0; i < 4; i++ {
		b.Events = append(b.Events, Event{Kind: KindBlockRemoved, BlockHashes: b.Events[i].BlockHashes, Medium: SomeString(MediumGPU)})
	}
	return b
}

// BenchmarkDecodeBatch decodes a busy step's batch into a reused Batch, as
// the subscriber does.
func BenchmarkDecodeBatch(b *testing.B) {
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		b.Run(enc.String(), func(b *testing.B) {
			payload := AppendBatch(nil, benchBatch(), enc)
			var got Batch
			var d Decoder
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Decode(payload, &got); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppendBatch encodes the same batch into a reused buffer, as the
// publisher does.
func BenchmarkAppendBatch(b *testing.B) {
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		b.Run(enc.String(), func(b *testing.B) {
			batch := benchBatch()
			buf := AppendBatch(nil, batch, enc)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendBatch(buf[:0], batch, enc)
			}
		})
	}
}
