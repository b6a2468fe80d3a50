package sim

// kvCache is vLLM V1's block pool: a fixed number of KV blocks, each with a
// reference count and, once full under prefix caching, the hash of its
// content (chained over all previous blocks). Blocks nobody references sit in
// a free queue in eviction order (least recently freed first); a free block
// that still has a hash is a cache entry that a later request with the same
// prefix can pick up again until it is evicted by an allocation.
//
// Usage, as vllm:kv_cache_usage_perc reports it, is 1 − free/total: cached but
// unreferenced blocks count as free. Not safe for concurrent use; the engine
// owns it.
type kvCache struct {
	n      int
	ref    []int32
	hash   []uint64 // 0 = not cached
	prev   []int32  // free-queue links, -1 = none
	next   []int32
	head   int32 // next to evict
	tail   int32
	nfree  int
	cached map[uint64]int32 // hash → block; nil when prefix caching is off
	// evicted, when set, hears of every cache entry an allocation evicts
	// (the KV events' BlockRemoved).
	evicted func(h uint64)
}

func newKVCache(numBlocks int, prefixCaching bool) *kvCache {
	c := &kvCache{
		n: numBlocks, ref: make([]int32, numBlocks), hash: make([]uint64, numBlocks),
		prev: make([]int32, numBlocks), next: make([]int32, numBlocks), head: -1, tail: -1,
	}
	if prefixCaching {
		c.cached = make(map[uint64]int32)
	}
	for i := range numBlocks {
		c.pushTail(int32(i))
	}
	return c
}

func (c *kvCache) usage() float64 {
	if c.n == 0 {
		return 0
	}
	return 1 - float64(c.nfree)/float64(c.n)
}

func (c *kvCache) pushTail(b int32) {
	c.prev[b], c.next[b] = c.tail, -1
	if c.tail >= 0 {
		c.next[c.tail] = b
	} else {
		c.head = b
	}
	c.tail = b
	c.nfree++
}

func (c *kvCache) unlink(b int32) {
	p, n := c.prev[b], c.next[b]
	if p >= 0 {
		c.next[p] = n
	} else {
		c.head = n
	}
	if n >= 0 {
		c.prev[n] = p
	} else {
		c.tail = p
	}
	c.prev[b], c.next[b] = -1, -1
	c.nfree--
}

// touch takes a reference on the cached block with hash h.
func (c *kvCache) touch(h uint64) int32 {
	b := c.cached[h]
	if c.ref[b] == 0 {
		c.unlink(b)
	}
	c.ref[b]++
	return b
}

// alloc takes a free block, evicting its cache entry. The caller has checked
// that one is free.
func (c *kvCache) alloc() int32 {
	b := c.head
	c.unlink(b)
	if h := c.hash[b]; h != 0 {
		if c.cached[h] == b {
			delete(c.cached, h)
			if c.evicted != nil {
				c.evicted(h)
			}
		}
		c.hash[b] = 0
	}
	c.ref[b] = 1
	return b
}

// release drops a request's references, last block first so that the tail
// of a sequence is evicted before its (more shareable) head.
func (c *kvCache) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		c.ref[b]--
		if c.ref[b] == 0 {
			c.pushTail(b)
		}
	}
}

// seal records that block b is full with content hash h, making it findable
// by later requests, and reports whether it became a cache entry. A hash
// already cached keeps its first block.
func (c *kvCache) seal(b int32, h uint64) bool {
	if c.cached == nil || c.hash[b] != 0 {
		return false
	}
	if _, ok := c.cached[h]; ok {
		return false
	}
	c.hash[b] = h
	c.cached[h] = b
	return true
}

// clear forgets every cache entry (blocks in use stay in use): a restarted
// engine's cache, or vLLM's reset_prefix_cache.
func (c *kvCache) clear() {
	if c.cached == nil {
		return
	}
	clear(c.cached)
	clear(c.hash)
}
