#!/usr/bin/env python3
"""How much of a Mooncake-format trace's prefix reuse a fleet can keep.

bench reports the ideal prefix-cache hit rate: one shared cache of
unbounded size. A fleet has N caches of bounded size, and an engine
evicts. This prints, for the trace's first ROWS requests:

  ideal     one shared unbounded cache (bench's gpurouter_ideal_prefix_cache_hit_rate)
  affinity  cache affinity on N replicas of KV_TOKENS each: every request
            on the replica holding its longest prefix among those with at
            most BOUND x the mean requests so far (ties to the one with
            the fewest; without a bound a prefix every prompt shares, a
            system prompt, sends everything to one replica), each
            replica's cache LRU, a
            request's blocks freed tail first as vLLM's free queue does,
            so its prefix outlives its tail
  random    the same caches with requests spread round robin

The affinity figure is what a router that never gives up a cached copy
can reach on that fleet; an engine's running requests also take KV, so
the real ceiling is a little lower. Rates count 512-token trace blocks
(hash ids) up to each prompt's length, as the ideal does.

  bench/scripts/prefix-bound.py --trace ../shared/data/mooncake-synthetic.jsonl --rows 800 \\
      --replicas 4 --kv-tokens 1668576
"""
import argparse
import json
from collections import OrderedDict

BLOCK = 512


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--rows", type=int, default=0, help="first ROWS requests (0: all)")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--bound", type=float, default=1.25, help="load bound, in requests over the mean (bounded-load hashing's 1 + epsilon)")
    ap.add_argument("--kv-tokens", type=int, required=True,
                    help="one replica's KV capacity in tokens (num_gpu_blocks x block_size)")
    a = ap.parse_args()
    rows = []
    with open(a.trace) as f:
        for line in f:
            if a.rows and len(rows) >= a.rows:
                break
            r = json.loads(line)
            n = (r["input_length"] + BLOCK - 1) // BLOCK
            rows.append(r["hash_ids"][:n])
    total = sum(len(ids) for ids in rows)
    if total == 0:
        raise SystemExit("no prompt blocks in the trace")
    seen, hits = set(), 0
    for ids in rows:
        hits += sum(1 for i in ids if i in seen)
        seen.update(ids)
    ideal = hits / total
    cap = max(a.kv_tokens // BLOCK, 1)
    print(f"{len(rows)} requests, {total} blocks of {BLOCK} tokens; {a.replicas} replicas of {a.kv_tokens} KV tokens ({cap} blocks each)")
    print(f"ideal     {ideal * 100:5.1f}%  (one shared unbounded cache)")
    for name in ("affinity", "random"):
        rate = simulate(rows, a.replicas, cap, a.bound if name == "affinity" else 0) / total
        print(f"{name:9} {rate * 100:5.1f}%  ({rate / ideal * 100 if ideal else 0:.0f}% of the ideal)")


def simulate(rows, n, cap, bound):
    caches = [OrderedDict() for _ in range(n)]
    count = [0] * n
    hits = 0
    for k, ids in enumerate(rows):
        held = [prefix_len(c, ids) for c in caches]
        if bound:
            limit = bound * (k + 1) / n
            ok = [i for i in range(n) if count[i] + 1 <= limit] or range(n)
            r = max(ok, key=lambda i: (held[i], -count[i]))
        else:
            r = k % n
        hits += held[r]
        count[r] += 1
        c = caches[r]
        for i in reversed(ids):  # freed tail first: the head is the most recently used
            c[i] = True
            c.move_to_end(i)
        while len(c) > cap:
            c.popitem(last=False)
    return hits


def prefix_len(cache, ids):
    n = 0
    for i in ids:
        if i not in cache:
            break
        n += 1
    return n


if __name__ == "__main__":
    main()
