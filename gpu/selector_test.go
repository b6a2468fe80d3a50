package gpu

import (
	"reflect"
	"testing"
)

func TestParseSelector(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    Selector
		wantErr bool
	}{
		{in: "", want: Selector{}},
		{in: "all", want: Selector{}},
		{in: "0", want: Selector{Indexes: []int{0}}},
		{in: " 0, 1 ,", want: Selector{Indexes: []int{0, 1}}},
		{in: "GPU-604ac76c-1b7e,3", want: Selector{Indexes: []int{3}, UUIDs: []string{"GPU-604ac76c-1b7e"}}},
		{in: "MIG-aa", want: Selector{UUIDs: []string{"MIG-aa"}}},
		{in: "-1", wantErr: true},
		{in: "gpu0", wantErr: true},
	} {
		got, err := ParseSelector(tc.in)
		if (err != nil) != tc.wantErr || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseSelector(%q) = %+v, %v", tc.in, got, err)
			continue
		}
		if err == nil {
			back, err := ParseSelector(got.String())
			if err != nil || !reflect.DeepEqual(back, got) {
				t.Errorf("%q: String %q does not round-trip", tc.in, got.String())
			}
		}
	}
}

func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"", "all", "0,1", "GPU-a,2", "MIG-x", "-3", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			return
		}
		back, err := ParseSelector(sel.String())
		if err != nil || !reflect.DeepEqual(back, sel) {
			t.Fatalf("%q → %q does not round-trip: %+v vs %+v (%v)", s, sel.String(), sel, back, err)
		}
	})
}
