#!/usr/bin/env python3
"""The routing-quality matrix's table, verdicts, summary and baseline
comparison (bench/scripts/routing-matrix.sh runs it on its runs' files).

Per run (OUT/WORKLOAD.FLEET.CONFIG[.rREP]): the bench result JSON (.json,
with gpurouter_engine_usage: each engine's mean KV use, prefix-cache and
preemption counter deltas over the run) and each engine's finished
requests (.counts). Medians over the reps are what is judged and what the
summary keeps.
"""
import argparse
import json
import math
import os
import statistics
import sys

SPEEDS = {"even": [1, 1, 1, 1], "uneven": [1, 1, 1, 0.5]}
ISSUE14 = ("conv85", "conv130", "burst")  # and their bounds, on the uneven fleet
ROUTER = ("default", "default_admission_off", "default_events")
PREFIX = ("mooncake85", "mooncake130")  # issue 51's bounds: prefix-cache hits near the ideal
FIGURES = ("p50", "p90", "p99", "tpot", "good", "fail", "preempt", "prefix", "pred", "gave", "ideal", "kv", "lag")
LAG_WARN = 0.05  # a run whose simulator ran this much late measured the machine, not the router
TOL = 0.05


def load_run(out, run):
    try:
        j = json.load(open(os.path.join(out, run + ".json")))
    except OSError:
        return None
    counts = [int(x) for x in open(os.path.join(out, run + ".counts")).read().split()]
    try:  # the simulator's lateness, as a share of its modelled step time
        lag = max(float(x) for x in open(os.path.join(out, run + ".lag")).read().split())
    except (OSError, ValueError):
        lag = None
    n = sum(counts) or 1
    usage = j.get("gpurouter_engine_usage") or []
    hits = sum(u.get("prefix_cache_hits") or 0 for u in usage)
    queries = sum(u.get("prefix_cache_queries") or 0 for u in usage)
    if not usage:  # bench read no engine (several routers): the engines' own counters at the end
        try:
            rows = [line.split() for line in open(os.path.join(out, run + ".prefix")) if line.strip()]
            hits, queries = sum(int(r[0]) for r in rows), sum(int(r[1]) for r in rows)
        except (OSError, ValueError, IndexError):
            pass
    kvs = [u["mean_kv_usage"] for u in usage if u.get("mean_kv_usage") is not None]
    try:  # the fleet and workload flags, so a baseline compares like with like
        settings = open(os.path.join(out, run + ".settings")).read().strip()
    except OSError:
        settings = None
    return dict(
        settings=settings, p50=j["median_ttft_ms"], p90=j["p90_ttft_ms"], p99=j["p99_ttft_ms"], tpot=j["p99_tpot_ms"],
        good=j.get("request_goodput") or 0, fail=j["failed"],
        preempt=sum(u.get("preemptions") or 0 for u in usage),
        prefix=hits / queries if queries else None,
        ideal=j.get("gpurouter_ideal_prefix_cache_hit_rate"),
        pred=j.get("gpurouter_router_predicted_prefix_cache_hit_rate"),
        gave=j.get("gpurouter_router_forgone_prefix_cache_hit_rate"),
        kv=statistics.mean(kvs) if kvs else None,
        shares=[k / n for k in counts], dropped=j.get("gpurouter_dataset_dropped") or 0, lag=lag,
        in_slo=round((j.get("request_goodput") or 0) * j["duration"]), total=len(j["ttfts"]), dur=j["duration"])


def median(runs):
    m = {}
    for k in FIGURES + ("in_slo", "total", "dur", "dropped"):
        vals = [r[k] for r in runs if r[k] is not None]
        m[k] = statistics.median(vals) if vals else None
    m["shares"] = [statistics.median(r["shares"][i] for r in runs) for i in range(len(runs[0]["shares"]))]
    m["reps"] = len(runs)
    m["settings"] = runs[0]["settings"]
    return m


def pct(v):
    return "-" if v is None else f"{v * 100:.1f}"


def table(res, args):
    hdr = (f"{'workload':11} {'fleet':6} {'config':24} {'P50 TTFT':>8} {'P90':>7} {'P99':>7} {'P99 TPOT':>8} "
           f"{'goodput':>7} {'fail':>4} {'preempt':>7} {'prefix%':>7} {'pred%':>5} {'gave%':>5} {'ideal%':>6} {'KV%':>5} {'lag%':>4}  request share % (capacity %)")
    print(hdr)
    print("-" * len(hdr))
    for w in args.workloads:
        for fl in args.fleets:
            cap = [s / sum(SPEEDS[fl]) for s in SPEEDS[fl]]
            for c in args.configs:
                for i, r in enumerate(res.get((w, fl, c), [])):
                    label = c + (f" #{i + 1}" if args.reps > 1 else "")
                    shares = " ".join(f"{s * 100:.0f}" for s in r["shares"])
                    print(f"{w:11} {fl:6} {label:24} {r['p50'] / 1000:7.2f}s {r['p90'] / 1000:6.2f}s {r['p99'] / 1000:6.2f}s "
                          f"{r['tpot']:6.0f}ms {r['good']:7.2f} {r['fail']:4d} {r['preempt']:7.0f} {pct(r['prefix']):>7} "
                          f"{pct(r['pred']):>5} {pct(r['gave']):>5} {pct(r['ideal']):>6} {pct(r['kv']):>5} {pct(r['lag']):>4}  {shares} ({' '.join(f'{x * 100:.0f}' for x in cap)})")
        late = [r for k, runs in res.items() if k[0] == w for r in runs if (r["lag"] or 0) > LAG_WARN]
        if late:
            print(f"{w}: WARNING: {len(late)} run(s) where the simulator ended its steps over {LAG_WARN * 100:.0f}% late (lag%): "
                  "the machine was too busy for their timings to mean much")
        dropped = max((r["dropped"] for k, runs in res.items() if k[0] == w for r in runs), default=0)
        if dropped:
            print(f"{w}: {dropped} trace rows longer than the max model length left out of every run (vLLM refuses them)")


def verdicts(med, args):
    """One line per row (workload x fleet); returns the rows that missed."""
    of = " (medians of the reps)" if args.reps > 1 else ""
    missed, out = [], []
    for w in args.workloads:
        for fl in args.fleets:
            d, h, off = (med.get((w, fl, c)) for c in ("default", "haproxy", "default_admission_off"))
            checks = []
            if d and h:
                g = d["good"] / h["good"] if h["good"] else math.inf
                checks.append((f"goodput {g:.2f}x HAProxy's (>= 1.1)", g >= 1.1))
                if h["in_slo"] and h["total"] and h["in_slo"] / h["total"] > 1 / 1.1:
                    # Goodput is requests in SLO over the run's length, which is
                    # the arrivals' span plus the last answers': a router that
                    # kept every request in SLO, in as long a run, gets
                    # total / in_slo times HAProxy's at most.
                    checks.append((f"[info] HAProxy kept {pct(h['in_slo'] / h['total'])}% of the requests in SLO: "
                                   f"at most {h['total'] / h['in_slo']:.2f}x is reachable", None))
                checks.append((f"P50 TTFT {d['p50'] / 1000:.2f}s vs {h['p50'] / 1000:.2f}s (<=)", d["p50"] <= h["p50"]))
                r99 = h["p99"] / d["p99"] if d["p99"] else math.inf
                if w in ISSUE14 and fl == "uneven":
                    checks.append((f"P99 TTFT {r99:.2f}x lower (>= 1.5)", r99 >= 1.5))
                    checks.append((f"goodput >= 1.3x", g >= 1.3))
                elif w in ISSUE14:
                    checks.append((f"[info] P99 TTFT {r99:.2f}x lower", None))
                if w in PREFIX:
                    checks.append((f"goodput >= 1.5x", g >= 1.5))
                    checks.append((f"P50 TTFT <= 0.5x HAProxy's", d["p50"] <= 0.5 * h["p50"]))
                if d.get("kv") is not None and h.get("kv") is not None:
                    checks.append((f"[info] mean KV {pct(d['kv'])}% vs HAProxy {pct(h['kv'])}%", None))
            if w in PREFIX:
                for c in ("default", "default_events"):
                    m = med.get((w, fl, c))
                    if m and m.get("prefix") is not None and m.get("ideal"):
                        ok = m["prefix"] >= 0.8 * m["ideal"] if c == "default" else None
                        checks.append((f"{c} prefix hits {pct(m['prefix'])}% of ideal {pct(m['ideal'])}% (>= 80%)", ok))
            if d and off:
                worse = [f"{name} {d[k] / off[k]:.2f}x" for name, k in (("P50 TTFT", "p50"), ("P99 TTFT", "p99"), ("P99 TPOT", "tpot"))
                         if off[k] and d[k] > off[k] * (1 + TOL)]
                if off["good"] and d["good"] < off["good"] * (1 - TOL):
                    worse.append(f"goodput {d['good'] / off['good']:.2f}x")
                checks.append(("admission on vs off " + ("never worse by > 5%" if not worse else "worse: " + ", ".join(worse)), not worse))
            cap = [s / sum(SPEEDS[fl]) for s in SPEEDS[fl]]
            for c in ROUTER:
                m = med.get((w, fl, c))
                if m:
                    worst = max(s / k for s, k in zip(m["shares"], cap))
                    checks.append((f"{c} max share/capacity {worst:.2f} (<= 1.5)", worst <= 1.5))
            if not checks:
                continue
            judged = [ok for _, ok in checks if ok is not None]
            verdict = "-" if not judged else ("PASS" if all(judged) else "MISS")
            if verdict == "MISS":
                missed.append((w, fl))
            marks = "; ".join(text + ("" if ok is None else (": ok" if ok else ": MISS")) for text, ok in checks)
            out.append(f"{verdict:4} {w} {fl}{of}: {marks}")
    print("\n".join(out))
    return missed


def baseline(med, path):
    """Each run's change against an earlier summary; the router's runs that
    got worse by more than 5% on a latency or goodput."""
    base = {(r["workload"], r["fleet"], r["config"]): r for r in json.load(open(path))["rows"]}
    worse = []
    print(f"\nagainst the baseline {path} (change in %; latencies: + is slower; goodput: - is less)")
    for k, m in sorted(med.items()):
        b = base.get(k)
        if not b:
            continue
        if b.get("settings") != m["settings"]:
            print(f"  {k[0]:11} {k[1]:6} {k[2]:22} not compared: other fleet or workload settings than the baseline's")
            continue
        ch, bad = [], []
        for name, f, up_is_bad in (("P50", "p50", True), ("P99", "p99", True), ("TPOT", "tpot", True), ("goodput", "good", False)):
            if not b.get(f) or m[f] is None:
                continue
            d = m[f] / b[f] - 1
            ch.append(f"{name} {d * 100:+.0f}%")
            if (d > TOL) if up_is_bad else (d < -TOL):
                bad.append(name)
        flag = ""
        if bad and k[2] in ROUTER:
            worse.append(k)
            flag = "  WORSE: " + ", ".join(bad)
        print(f"  {k[0]:11} {k[1]:6} {k[2]:22} " + "  ".join(ch) + flag)
    return worse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", required=True)
    ap.add_argument("--fleets", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--baseline")
    args = ap.parse_args()
    args.workloads, args.fleets, args.configs = args.workloads.split(), args.fleets.split(), args.configs.split()

    res = {}
    for w in args.workloads:
        for fl in args.fleets:
            for c in args.configs:
                for rep in range(1, args.reps + 1):
                    r = load_run(args.out, f"{w}.{fl}.{c}" + (f".r{rep}" if rep > 1 else ""))
                    if r:
                        res.setdefault((w, fl, c), []).append(r)
    print()
    table(res, args)
    med = {k: median(v) for k, v in res.items()}
    print()
    missed = verdicts(med, args)
    rows = [dict(workload=k[0], fleet=k[1], config=k[2], **{f: m[f] for f in FIGURES + ("shares", "reps", "dropped", "settings")})
            for k, m in sorted(med.items())]
    with open(args.summary, "w") as f:
        json.dump({"reps": args.reps, "rows": rows, "missed": [list(x) for x in missed]}, f, indent=1)
    print(f"\nsummary (every run's medians): {args.summary}")
    worse = baseline(med, args.baseline) if args.baseline else []
    if missed or worse:
        print(f"\n{len(missed)} row(s) missed a verdict, {len(worse)} router run(s) worse than the baseline")
        sys.exit(1)


if __name__ == "__main__":
    main()
