package prefixcache

// Byte-level BPE as Hugging Face's tokenizers applies it: a piece's bytes
// start as one symbol each, and the adjacent pair with the lowest merge
// rank (the leftmost of equal ones) merges until no pair has a merge.

import "math"

// noMerge is a pair's rank when the merges hold none for it.
const noMerge = math.MaxUint32

// heapMinSymbols is the piece length from which merging uses a heap:
// below it a scan over the pairs' ranks is faster and allocates nothing;
// above, the scan's quadratic cost shows (a long run of punctuation is
// one piece).
const heapMinSymbols = 64

// byteLevelAlphabet is GPT-2's bytes_to_unicode: the printable byte
// values stand for themselves, the others for the code points from 256
// up, in byte order. A byte-level vocabulary's token strings are bytes
// written in this alphabet.
func byteLevelAlphabet() [256]rune {
	var a [256]rune
	n := rune(256)
	for b := range 256 {
		switch {
		case b >= '!' && b <= '~', b >= 0xA1 && b <= 0xAC, b >= 0xAE:
			a[b] = rune(b)
		default:
			a[b] = n
			n++
		}
	}
	return a
}

// mergeTable maps a pair of token ids to its merge's rank and the merged
// token's id.
type mergeTable map[uint64]uint64

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// rank is pair (a, b)'s merge rank and merged id; noMerge when none.
func (m mergeTable) rank(a, b uint32) (rank, id uint32) {
	v, ok := m[pairKey(a, b)]
	if !ok {
		return noMerge, 0
	}
	return uint32(v >> 32), uint32(v)
}

// bpeScratch is one piece's working state, reused through a sync.Pool.
type bpeScratch struct {
	ids, ranks, merged []uint32
	prev, next         []int32
	heap               mergeHeap
}

// mergeScan merges ids in place (the piece's byte symbols) and returns
// the result: each step finds the lowest-ranked pair by a scan of the
// pairs' cached ranks, so that only the two pairs beside a merge are
// looked up again.
func (m mergeTable) mergeScan(s *bpeScratch, ids []uint32) []uint32 {
	ranks, merged := s.ranks[:0], s.merged[:0]
	for i := 0; i+1 < len(ids); i++ {
		r, id := m.rank(ids[i], ids[i+1])
		ranks, merged = append(ranks, r), append(merged, id)
	}
	for len(ids) > 1 {
		best, at := uint32(noMerge), -1
		for i, r := range ranks {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		ids[at] = merged[at]
		ids = append(ids[:at+1], ids[at+2:]...)
		ranks = append(ranks[:at], ranks[at+1:]...)
		merged = append(merged[:at], merged[at+1:]...)
		if at > 0 {
			ranks[at-1], merged[at-1] = m.rank(ids[at-1], ids[at])
		}
		if at < len(ranks) {
			ranks[at], merged[at] = m.rank(ids[at], ids[at+1])
		}
	}
	s.ranks, s.merged = ranks, merged
	return ids
}

// mergeCand is a pair that may merge: the left symbol's position (its
// byte index in the piece, which orders equal ranks leftmost first) and
// the right one's at the time it was pushed.
type mergeCand struct {
	rank        uint32
	left, right int32
}

type mergeHeap []mergeCand

func (h mergeHeap) less(i, j int) bool {
	return h[i].rank < h[j].rank || h[i].rank == h[j].rank && h[i].left < h[j].left
}

func (h *mergeHeap) push(c mergeCand) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeCand {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < n && s.less(l, small) {
			small = l
		}
		if l+1 < n && s.less(l+1, small) {
			small = l + 1
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}

// mergeHeap merges ids as mergeScan does, for long pieces: the symbols
// are a linked list over their byte positions and the candidate pairs a
// heap; a popped pair that no longer exists (a neighbour merged since) is
// skipped. Returns the merged ids (in ids' storage).
func (m mergeTable) mergeHeap(s *bpeScratch, ids []uint32) []uint32 {
	n := len(ids)
	prev, next := s.prev[:0], s.next[:0]
	for i := range n {
		prev, next = append(prev, int32(i-1)), append(next, int32(i+1))
	}
	h := s.heap[:0]
	for i := 0; i+1 < n; i++ {
		if r, _ := m.rank(ids[i], ids[i+1]); r != noMerge {
			h.push(mergeCand{rank: r, left: int32(i), right: int32(i + 1)})
		}
	}
	dead := uint32(noMerge) // ids[j] of a symbol merged into its left neighbour
	for len(h) > 0 {
		c := h.pop()
		l, r := c.left, c.right
		if ids[l] == dead || ids[r] == dead || next[l] != r {
			continue
		}
		rank, id := m.rank(ids[l], ids[r])
		if rank != c.rank {
			continue // the right symbol grew since: its pair was pushed anew
		}
		ids[l], ids[r] = id, dead
		nr := next[r]
		next[l] = nr
		if int(nr) < n {
			prev[nr] = l
			if rk, _ := m.rank(id, ids[nr]); rk != noMerge {
				h.push(mergeCand{rank: rk, left: l, right: nr})
			}
		}
		if p := prev[l]; p >= 0 {
			if rk, _ := m.rank(ids[p], id); rk != noMerge {
				h.push(mergeCand{rank: rk, left: p, right: l})
			}
		}
	}
	s.prev, s.next, s.heap = prev, next, h
	out := ids[:0]
	for i := int32(0); int(i) < n; i = next[i] {
		out = append(out, ids[i])
	}
	return out
}
