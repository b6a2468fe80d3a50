#!/usr/bin/env python3
"""A synthetic long-context multi-turn chat trace, in Mooncake's format
(`bench --dataset-name mooncake`), for the routing matrix's chat rows.

It stands in for a production conversation trace that the project does
not have: prompts long (lognormal, mean ~13k tokens, median ~7k, a few
past 80k), outputs ~340 tokens, every prompt opening with the same
1,024-token system block, and about a quarter of the conversations coming
back for more turns that resend the conversation so far (history, the
previous answer, a new message) — about 27% of all prompt blocks repeat
an earlier one. New conversations arrive as a Poisson process.

  bench/scripts/chat-trace.py [--seed N] [--requests N] [--rate R] > chat.jsonl

Deterministic for a seed. Block ids: 0-1 the system block; every other id
once, chained as Mooncake's are (the same id always follows the same
prefix).
"""
import argparse
import heapq
import json
import math
import random

BLOCK = 512
MAX_LEN = 131072 - 1000  # room for the output under --max-model-len 131072


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=1200)
    ap.add_argument("--rate", type=float, default=8.0, help="new conversations x mean turns, per second")
    ap.add_argument("--turns", type=float, default=1.35, help="mean turns per conversation (geometric)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    next_id = [2]

    def new_ids(k):
        ids = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return ids

    h, t, conv = [], 0.0, 0
    horizon = a.requests / a.rate * 1.5
    while t < horizon:
        t += rng.expovariate(a.rate / a.turns)
        heapq.heappush(h, (t, conv, None))
        conv += 1
    out = []
    while h and len(out) < a.requests:
        tm, c, state = heapq.heappop(h)
        if state is None:
            length = int(min(max(rng.lognormvariate(math.log(6500), 1.15), 300), MAX_LEN))
            ids = [0, 1] + new_ids(max(1, math.ceil((length - 2 * BLOCK) / BLOCK)))
        else:
            ids, prev, prev_out = state
            msg = int(min(max(rng.lognormvariate(math.log(600), 1.2), 20), 20000))
            length = prev + prev_out + msg
            if length > MAX_LEN:
                continue
            keep = prev // BLOCK  # the previous prompt's last block was partial
            ids = ids[:keep] + new_ids(math.ceil(length / BLOCK) - keep)
        output = int(min(max(rng.lognormvariate(math.log(260), 0.75), 5), 2000))
        out.append({"timestamp": int(tm * 1000), "input_length": length, "output_length": output,
                    "hash_ids": ids[:math.ceil(length / BLOCK)]})
        if rng.random() < 1 - 1 / a.turns:
            heapq.heappush(h, (tm + rng.uniform(5, 60), c, (ids, length, output)))
    out.sort(key=lambda r: r["timestamp"])
    t0 = out[0]["timestamp"] if out else 0
    for r in out:
        r["timestamp"] -= t0
        print(json.dumps(r))


if __name__ == "__main__":
    main()
