package gpu

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
)

func TestParseDCGMGolden(t *testing.T) {
	t.Parallel()
	gpus, err := ParseDCGM(readTestdata(t, "dcgm.txt"))
	if err != nil {
		t.Fatal(err)
	}
	const name = "NVIDIA H100 80GB HBM3"
	want := []GPUStats{
		{Index: 0, UUID: "GPU-604ac76c-1b7e-5d2a-8c3f-0a1b2c3d4e50", Name: name, UtilizationPct: 87,
			MemoryUsedBytes: 73281 << 20, MemoryTotalBytes: (73281 + 7211 + 623) << 20, PowerWatts: 512.345,
			TemperatureC: 61, SMClockMHz: 1980},
		{Index: 1, UUID: "GPU-604ac76c-1b7e-5d2a-8c3f-0a1b2c3d4e51", Name: name, UtilizationPct: 100,
			MemoryUsedBytes: 79980 << 20, MemoryTotalBytes: (79980 + 512 + 623) << 20, PowerWatts: 689.912,
			TemperatureC: 74, SMClockMHz: 1755},
		{Index: 2, UUID: "GPU-604ac76c-1b7e-5d2a-8c3f-0a1b2c3d4e52", Name: name, UtilizationPct: 0,
			MemoryUsedBytes: 0, MemoryTotalBytes: (80993 + 622) << 20, PowerWatts: 71.004,
			TemperatureC: 29, SMClockMHz: 345},
	}
	if !reflect.DeepEqual(gpus, want) {
		t.Errorf("got  %+v\nwant %+v", gpus, want)
	}
}

func TestParseDCGMEdgeCases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text string
		want       []GPUStats
		wantErr    error
	}{
		{name: "MIG instances: the first series of a field wins, sorted by index",
			text: `DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"} 90
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a"} 5
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b",GPU_I_ID="7"} 1024
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b",GPU_I_ID="7"} 1024
`,
			want: []GPUStats{{Index: 0, UUID: "GPU-a", UtilizationPct: 5},
				{Index: 1, UUID: "GPU-b", UtilizationPct: 40, MemoryUsedBytes: 1 << 30, MemoryTotalBytes: 2 << 30}}},
		{name: "no UUID label: keyed by gpu index",
			text: "DCGM_FI_DEV_GPU_TEMP{gpu=\"3\"} 50\nDCGM_FI_DEV_SM_CLOCK{gpu=\"3\"} 1200\n",
			want: []GPUStats{{Index: 3, TemperatureC: 50, SMClockMHz: 1200}}},
		{name: "series with neither label and bad values are skipped",
			text:    "DCGM_FI_DEV_GPU_TEMP{hostname=\"x\"} 50\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} NaN\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} -1\n",
			wantErr: ErrGPUNotFound},
		{name: "vLLM metrics are not DCGM", text: string(readTestdata(t, "vllm_v1.txt")), wantErr: ErrGPUNotFound},
		{name: "malformed", text: "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 5\n", wantErr: ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseDCGM([]byte(tc.text))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDCGMSource(t *testing.T) {
	t.Parallel()
	body := readTestdata(t, "dcgm.txt")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Write(body)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name    string
		url     string
		sel     Selector
		want    []int
		wantErr error
	}{
		{"by UUID label", srv.URL, Selector{UUIDs: []string{"GPU-604ac76c-1b7e-5d2a-8c3f-0a1b2c3d4e51"}}, []int{1}, nil},
		{"by gpu label", srv.URL + "/metrics", Selector{Indexes: []int{0, 2}}, []int{0, 2}, nil},
		{"all", srv.URL, Selector{}, []int{0, 1, 2}, nil},
		{"missing GPU", srv.URL, Selector{Indexes: []int{4}}, nil, ErrGPUNotFound},
		{"wrong path", srv.URL + "/nope", Selector{}, nil, ErrHTTPStatus},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := NewDCGMSource(tc.url, tc.sel, nil)
			if err != nil {
				t.Fatal(err)
			}
			gpus, err := src.Fetch(ctxTimeout(t))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			var got []int
			for _, g := range gpus {
				got = append(got, g.Index)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("indexes %v, want %v", got, tc.want)
			}
		})
	}
}

func FuzzParseDCGM(f *testing.F) {
	// One GPU's lines of the golden: small seeds keep the fuzzer fuzzing
	// rather than minimising.
	f.Add([]byte(`DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-604ac76c",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"} 1980
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-604ac76c",modelName="NVIDIA H100 80GB HBM3"} 61
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-604ac76c"} 512.345000
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-604ac76c"} 87
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-604ac76c"} 7211
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-604ac76c"} 73281
DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-604ac76c"} 623
`))
	f.Add([]byte("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\"} 5\nDCGM_FI_DEV_FB_USED{gpu=\"x\"} 1e300\n"))
	f.Fuzz(func(t *testing.T, text []byte) {
		gpus, err := ParseDCGM(text)
		if err != nil {
			if !errors.Is(err, ErrGPUNotFound) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		for i, g := range gpus {
			if g.UtilizationPct < 0 || g.UtilizationPct > 100 || g.MemoryUsedBytes > g.MemoryTotalBytes {
				t.Fatalf("out of range: %+v", g)
			}
			if i > 0 && gpus[i-1].Index > g.Index {
				t.Fatal("not sorted by index")
			}
		}
	})
}
