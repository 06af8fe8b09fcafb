#!/usr/bin/env python3
"""Ours against a previous release loaded into the same sdpa-bench process (issue 28's check).

    build-release/bench/sdpa-bench --baseline "$(bench/build_baseline.sh 9892fff | tail -n 1)" --csv run.csv
    python3 bench/vs_release.py run.csv [--release prev-0.5] [--limit 1.02]

For every shape x dtype x threads row that has both an own candidate (tiled, decode, auto) and
the release's (prev-0.5:tiled, ...), prints ours / release of the medians (and of the minimums,
which a shared machine disturbs less), the kernel each ran, and marks a median ratio above
--limit. Exit status 0 always: one run's misses are read against a rerun (noise), not gated.
"""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--release", default="prev-0.5")
    ap.add_argument("--limit", type=float, default=1.02)
    a = ap.parse_args()
    rows = {}
    with open(a.csv, newline="") as f:
        for r in csv.DictReader(f):
            if r["status"] != "ok":
                continue
            rows[(r["shape"], r["path"], r["dtype"], r["threads"])] = r
    out, over = [], 0
    for (shape, path, dt, th), r in rows.items():
        if ":" in path:
            continue
        p = rows.get((shape, f"{a.release}:{path}", dt, th))
        if p is None:
            continue
        med = float(r["median_ms"]) / float(p["median_ms"])
        mn = float(r["min_ms"]) / float(p["min_ms"])
        flag = "  > limit" if med > a.limit else ""
        over += med > a.limit
        out.append(f"{shape:36} {path:7} {dt:7} {th:>2}t  median {med:5.3f}  min {mn:5.3f}  "
                   f"{r['kernel']:24} {p['kernel']}{flag}")
    print(f"ours / {a.release} (median and min of each candidate; kernel ours, kernel {a.release})")
    print("\n".join(out))
    print(f"{len(out)} rows, {over} with a median ratio above {a.limit}")


if __name__ == "__main__":
    main()
