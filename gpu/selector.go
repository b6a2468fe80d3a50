package gpu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Selector binds a replica to GPUs on a host, by NVML index (DCGM's `gpu`
// label) or by UUID (DCGM's `UUID` label). A GPU matches when its index is
// in Indexes or its UUID is in UUIDs. The zero value selects every GPU on
// the host, which is what the agent serves.
type Selector struct {
	Indexes []int    // e.g. [0 1] for a tensor-parallel-2 replica on GPUs 0 and 1
	UUIDs   []string // e.g. ["GPU-604ac76c-…"]; MIG UUIDs ("MIG-…") are matched literally
}

// ParseSelector reads the configuration form of a Selector: a comma-separated
// list of indexes and UUIDs ("0,1", "GPU-604ac76c-…"); "" or "all" selects
// every GPU.
func ParseSelector(s string) (Selector, error) {
	var sel Selector
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return sel, nil
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if i, err := strconv.Atoi(item); err == nil {
			if i < 0 {
				return Selector{}, fmt.Errorf("gpu: selector %q: negative index %d", s, i)
			}
			sel.Indexes = append(sel.Indexes, i)
			continue
		}
		if !strings.HasPrefix(item, "GPU-") && !strings.HasPrefix(item, "MIG-") {
			return Selector{}, fmt.Errorf("gpu: selector %q: %q is neither an index nor a GPU-/MIG- UUID", s, item)
		}
		sel.UUIDs = append(sel.UUIDs, item)
	}
	return sel, nil
}

// All reports whether s selects every GPU.
func (s Selector) All() bool { return len(s.Indexes) == 0 && len(s.UUIDs) == 0 }

// Match reports whether the GPU with this index and UUID is selected.
func (s Selector) Match(index int, uuid string) bool {
	return s.All() || slices.Contains(s.Indexes, index) || slices.Contains(s.UUIDs, uuid)
}

// String is the ParseSelector form of s.
func (s Selector) String() string {
	if s.All() {
		return "all"
	}
	parts := make([]string, 0, len(s.Indexes)+len(s.UUIDs))
	for _, i := range s.Indexes {
		parts = append(parts, strconv.Itoa(i))
	}
	return strings.Join(append(parts, s.UUIDs...), ",")
}

// pick returns the GPUs of all that s selects, in the order of all, or an
// error wrapping ErrGPUNotFound naming every selected GPU that is missing.
// The result may share memory with all; neither is modified.
func (s Selector) pick(all []GPUStats) ([]GPUStats, error) {
	if s.All() {
		return all, nil
	}
	out := make([]GPUStats, 0, len(s.Indexes)+len(s.UUIDs))
	for _, g := range all {
		if s.Match(g.Index, g.UUID) {
			out = append(out, g)
		}
	}
	var missing []string
	for _, i := range s.Indexes {
		if !slices.ContainsFunc(out, func(g GPUStats) bool { return g.Index == i }) {
			missing = append(missing, strconv.Itoa(i))
		}
	}
	for _, u := range s.UUIDs {
		if !slices.ContainsFunc(out, func(g GPUStats) bool { return g.UUID == u }) {
			missing = append(missing, u)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s (host has %d GPUs)", ErrGPUNotFound, strings.Join(missing, ","), len(all))
	}
	return out, nil
}
