#!/usr/bin/env python3
"""The targets of issue 9 section 5 (libsdpa 0.4) and of issue 10 (0.5 serving) from sdpa-bench
rows of one run.

    /usr/bin/python3 bench/targets.py bench/results/sdpa_bench.csv [more.csv ...] [--torch torch.csv]

compare_torch.py calls targets_issue9() and targets_issue10() after its own issue-4 table; this
file can also be run on saved CSVs (it prints both tables). The issue-10 rows are sdpa-bench's
serving cases (paged-, mixed-, sinkalibi-, pool-; see targets_issue10 and bench/README.md). Rows are told apart by (shape, path, dtype, threads, isa_cap): isa_cap is the
SDPA_MAX_ISA the sdpa-bench process ran under ("native" = unset), each ISA its own process.
Unless a target says otherwise: library = the `auto` rows, 2 threads (the largest thread count
of the run), isa_cap native, medians. Every row names the kernel that ran (sdpa_last_kernel()),
the dtypes and the thread count.

Verdicts: pass / MISS (by how much: the measured value against the goal) / n/a (a row it needs
is missing from the CSV) / not run (the library does not compute that dtype yet, answering
SDPA_ERR_DTYPE, or the CPU lacks the hardware: AMX, AVX512-BF16) / info (no goal: context).

The FMA peak is the fastest call of the probe (fma-avx512, else fma-avx2) at the same thread
count, max over rounds (a peak is an upper bound; the prefill side is the median, so the
ratio is conservative on a noisy machine).
"""
import argparse
import csv
import math
import sys

PREV_ALLOWANCE = 0.03  # "no worse than 0.3": ratio <= 1 + this (same-run noise on a shared VM)


def _f(s):
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _key(r):
    return (r["shape"], r["path"], r.get("dtype") or "f32", int(r["threads"]), r.get("isa_cap") or "native")


class Rows:
    def __init__(self, rows):
        self.rows = rows
        self.idx = {_key(r): r for r in rows}

    def get(self, shape, path, dtype="f32", n=2, isa="native"):
        return self.idx.get((shape, path, dtype, n, isa))

    def ms(self, shape, path, dtype="f32", n=2, isa="native"):
        r = self.get(shape, path, dtype, n, isa)
        return _f(r["median_ms"]) if r is not None and r["status"] == "ok" else None

    def status(self, shape, path, dtype="f32", n=2, isa="native"):
        r = self.get(shape, path, dtype, n, isa)
        return r["status"] if r is not None else "missing"

    def kernel(self, shape, path="auto", dtype="f32", n=2, isa="native"):
        r = self.get(shape, path, dtype, n, isa)
        return r["kernel"] if r is not None else "-"

    def shapes(self, isa="native"):
        seen, out = set(), []
        for r in self.rows:
            if (r.get("isa_cap") or "native") == isa and r["shape"] not in seen:
                seen.add(r["shape"])
                out.append({"name": r["shape"], "kind": r["kind"], "B": int(r["B"]), "H": int(r["H"]),
                            "L": int(r["L"]), "S": int(r["S"]), "E": int(r["E"]),
                            "Hkv": int(r.get("Hkv") or r["H"]), "causal": int(r["causal"])})
        return out

    def isas(self):
        return sorted({r.get("isa_cap") or "native" for r in self.rows})

    def cpu_flags(self):
        for r in self.rows:
            if r.get("cpu_flags") and r["cpu_flags"] != "unknown":
                return set(r["cpu_flags"].split("+"))
        return None

    def peak(self, n, isa="native"):
        """(GF/s of the fastest probe call, which probe) at n threads."""
        best = None
        for p in ("fma-avx512", "fma-avx2"):
            r = self.get("peak-fma", p, "f32", n, isa)
            if r is None or r["status"] != "ok":
                continue
            mn = _f(r["min_ms"])
            g_med = _f(r["gflops_dense"])
            med = _f(r["median_ms"])
            if mn and g_med and med:
                g = g_med * med / mn
                if best is None or g > best[0]:
                    best = (g, p)
        return best


def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def targets_issue9(bench_rows, torch_rows=None, n2=2, prev_allowance=PREV_ALLOWANCE):
    """Issue 9 section 5 targets: list of (target, measured, goal, verdict, detail)."""
    R = Rows(bench_rows)
    res = []
    flags = R.cpu_flags()

    def add(name, value, op, thr, detail, verdict=None):
        if verdict is not None:
            res.append((name, fmt(value), f"{op} {thr}" if op else "-", verdict, detail))
            return
        if value is None:
            res.append((name, "-", f"{op} {thr}", "n/a", detail))
            return
        ok = value <= thr if op == "<=" else value >= thr
        miss = "" if ok else (f" (by {abs(value / thr - 1) * 100:.1f}%)")
        res.append((name, fmt(value), f"{op} {thr}", ("pass" if ok else "MISS") + miss, detail))

    def lib_not_run(shape, dtype, n=n2, isa="native", path="auto"):
        """'not run' when the library answered SDPA_ERR_DTYPE for this row."""
        r = R.get(shape, path, dtype, n, isa)
        if r is not None and r["status"] == "unsupported" and "SDPA_ERR_DTYPE" in r.get("note", ""):
            return "not run (library answers SDPA_ERR_DTYPE for " + dtype + ")"
        if r is not None and r["status"] == "unsupported" and "AMX_unavailable" in r.get("note", ""):
            return "not run (sdpa_request_amx() refused: " + r["note"].split("AMX_unavailable:", 1)[-1] + ")"
        return None

    def where(shape, dtype="f32", n=n2, isa="native", path="auto"):
        return f"{path} {R.kernel(shape, path, dtype, n, isa)}, {dtype}, {n}t, isa {isa}"

    shapes = R.shapes()
    by = lambda kind, B, H, L, S, E: next((s["name"] for s in shapes if (s["kind"], s["B"], s["H"], s["L"], s["S"],
                                                                         s["E"]) == (kind, B, H, L, S, E)), None)

    # --- FMA peak (context for the prefill target)
    for n in sorted({int(r["threads"]) for r in bench_rows if r["shape"] == "peak-fma"}):
        for p in ("fma-avx512", "fma-avx2"):
            r = R.get("peak-fma", p, "f32", n)
            if r is None:
                continue
            if r["status"] != "ok":
                add(f"FMA peak {p} ({n}t)", None, "", "", r.get("note", ""), verdict="not run")
                continue
            mn, med = _f(r["min_ms"]), _f(r["median_ms"])
            g = _f(r["gflops_dense"])
            add(f"FMA peak {p} ({n}t): GF/s, fastest call", g * med / mn if g and mn else None, "", "",
                f"median {fmt(g, '.1f')} GF/s, spread {r['min_ms']}..{r['max_ms']} ms over {r['reps']} calls",
                verdict="info")
    p1, p2 = R.peak(1), R.peak(n2)
    if p1 and p2:
        add(f"FMA peak scaling: {n2}t / 1t", p2[0] / p1[0], "", "", f"{p2[1]}: {p1[0]:.1f} -> {p2[0]:.1f} GF/s",
            verdict="info")

    # --- f32 vs the previous release (0.3), same run
    have_prev = any(r["path"].startswith("prev-0.3:") for r in bench_rows)
    for s in shapes:
        if s["kind"] == "peak" or s["kind"] in SERVING_KINDS:
            continue
        for n in (1, n2):
            ours, prev = R.ms(s["name"], "auto", "f32", n), R.ms(s["name"], "prev-0.3:auto", "f32", n)
            if not have_prev:
                if n == n2:
                    add(f"f32 vs 0.3 {s['name']}: ours / 0.3", None, "<=", 1 + prev_allowance,
                        "no prev-0.3 rows (run with a baseline: --baseline build)", verdict="not run")
                continue
            t_ours, t_prev = R.ms(s["name"], "tiled", "f32", n), R.ms(s["name"], "prev-0.3:tiled", "f32", n)
            ro, rp = R.get(s["name"], "auto", "f32", n), R.get(s["name"], "prev-0.3:auto", "f32", n)
            spread = (f"; spread ours {ro['min_ms']}..{ro['max_ms']}, 0.3 {rp['min_ms']}..{rp['max_ms']} ms"
                      if ro and rp and ours and prev else "")
            add(f"f32 vs 0.3 {s['name']} ({n}t): auto ours / 0.3", ours / prev if ours and prev else None, "<=",
                round(1 + prev_allowance, 3),
                f"ours {fmt(ours, '.4f')} ms ({R.kernel(s['name'], 'auto', 'f32', n)}), 0.3 {fmt(prev, '.4f')} ms "
                f"({R.kernel(s['name'], 'prev-0.3:auto', 'f32', n)}); tiled ours/0.3 "
                f"{fmt(t_ours / t_prev if t_ours and t_prev else None)}{spread}")

    # --- decode: bandwidth floors, f16/bf16 speed-up, GQA
    for kind, B, H, S, E in (("decode", 1, 32, 4096, 128), ("decode", 8, 32, 1024, 128),
                             ("gqa", 1, 32, 4096, 128), ("gqa", 8, 32, 1024, 128)):
        name = by(kind, B, H, 1, S, E)
        if name is None:
            continue
        f32_ms = R.ms(name, "auto", "f32")
        for dt in ("f32", "f16kv", "bf16kv"):
            goal = 0.95 if (dt == "f32" and kind == "decode") else 0.90
            lib, bw = R.ms(name, "auto", dt), R.ms(name, "bw-floor", dt)
            nr = lib_not_run(name, dt)
            label = f"{kind} {name} {dt}: bw-floor time / time ({n2}t)"
            detail = f"{where(name, dt)}: {fmt(lib, '.3f')} ms, floor {fmt(bw, '.3f')} ms (bytes as stored)"
            if nr:
                add(label, None, ">=", goal, detail, verdict=nr)
            elif lib and bw and bw / lib > FLOOR_SANE:
                add(label, bw / lib, ">=", goal, detail, verdict=f"invalid (the floor measured {bw / lib:.2f}x the "
                    f"kernel it bounds: the floor's calls were slowed by noise; rerun)")
            elif R.get(name, "auto", dt) is not None or dt == "f32":
                add(label, bw / lib if lib and bw else None, ">=", goal, detail)
            if dt != "f32" and kind == "decode" and (nr or R.get(name, "auto", dt) is not None):
                label = f"{kind} {name} {dt}: our f32 time / {dt} time ({n2}t)"
                detail = f"f32 {fmt(f32_ms, '.3f')} ms, {dt} {fmt(lib, '.3f')} ms ({R.kernel(name, 'auto', dt)})"
                if nr:
                    add(label, None, ">=", 1.8, detail, verdict=nr)
                else:
                    add(label, f32_ms / lib if f32_ms and lib else None, ">=", 1.8, detail)

    # --- bf16 prefill at L = S = 4096, E = 128; f16-K/V prefill
    big = by("dense", 1, 8, 4096, 4096, 128)
    for name in [x for x in (by("dense", 1, 8, 1024, 1024, 64), big) if x]:
        f32_ms = R.ms(name, "auto", "f32")
        if name == big:
            for hw, flag, goal in (("AVX512-BF16", "avx512_bf16", 1.6), ("AMX", "amx_bf16", 4.0)):
                # measured on bf16r (SDPA_PRECISION_REDUCED: bf16 dot products, P rounded; bf16 is
                # DEFAULT), AMX on bf16amx (the same calls after sdpa_request_amx())
                dtr = "bf16r" if R.get(name, "auto", "bf16r") is not None else "bf16"
                if hw == "AMX" and R.get(name, "auto", "bf16amx") is not None:
                    dtr = "bf16amx"
                lib = R.ms(name, "auto", dtr)
                label = f"bf16 prefill {name} with {hw}: our f32 time / {dtr} time ({n2}t)"
                detail = f"f32 {fmt(f32_ms, '.1f')} ms, {dtr} {fmt(lib, '.1f')} ms ({R.kernel(name, 'auto', dtr)})"
                nr = lib_not_run(name, dtr)
                if flags is not None and flag not in flags:
                    add(label, None, ">=", goal, detail, verdict=f"not run (no {flag} on this CPU)")
                elif nr:
                    add(label, None, ">=", goal, detail, verdict=nr)
                elif hw == "AMX" and "amx" not in R.kernel(name, "auto", dtr):
                    add(label, f32_ms / lib if f32_ms and lib else None, ">=", goal,
                        detail + "; the kernel that ran is not an AMX one (AMX permission not requested?)",
                        verdict="not run")
                else:
                    add(label, f32_ms / lib if f32_ms and lib else None, ">=", goal, detail)
        lib = R.ms(name, "auto", "f16kv")
        label = f"f16-K/V prefill {name}: f16kv time / our f32 time ({n2}t)"
        detail = f"f32 {fmt(f32_ms, '.1f')} ms, f16kv {fmt(lib, '.1f')} ms ({R.kernel(name, 'auto', 'f16kv')})"
        nr = lib_not_run(name, "f16kv")
        if nr:
            add(label, None, "<=", 1.1, detail, verdict=nr)
        elif R.get(name, "auto", "f16kv") is not None:
            add(label, lib / f32_ms if f32_ms and lib else None, "<=", 1.1, detail)

    # --- small shapes against the BLAS floor (finite check on: the bench's default)
    for name in [x for x in (by("dense", 1, 8, 128, 128, 64), by("cross", 2, 8, 64, 1024, 64)) if x]:
        lib, fl = R.ms(name, "auto"), R.ms(name, "blas-floor")
        add(f"BLAS floor {name}: time / floor ({n2}t, finite check on)", lib / fl if lib and fl else None, "<=",
            1.15, f"{where(name)}: {fmt(lib, '.3f')} ms, floor {fmt(fl, '.3f')} ms")

    # --- f32 dense prefill against the FMA peak
    pk = R.peak(n2)
    for s in shapes:
        if s["kind"] == "dense" and s["L"] == s["S"] and s["L"] >= 1024:
            r = R.get(s["name"], "auto", "f32", n2)
            g = _f(r["gflops_dense"]) if r is not None and r["status"] == "ok" else None
            add(f"f32 dense prefill {s['name']}: GF/s / FMA peak ({n2}t)", g / pk[0] if g and pk else None, ">=",
                0.72, f"{where(s['name'])}: {fmt(g, '.1f')} GF/s, peak {fmt(pk[0] if pk else None, '.1f')} GF/s "
                      f"({pk[1] if pk else '-'})")

    # --- thread scaling
    for s in shapes:
        small = (s["kind"], s["B"], s["H"], s["L"], s["S"], s["E"]) == ("dense", 1, 8, 128, 128, 64)
        if small or (s["kind"] in ("dense", "causal", "memory") and s["L"] >= 1024):
            t1, t2 = R.ms(s["name"], "auto", "f32", 1), R.ms(s["name"], "auto", "f32", n2)
            add(f"scaling {s['name']}: t(1t) / t({n2}t)", t1 / t2 if t1 and t2 else None, ">=", SMALL_SCALING_GOAL if small else 1.8,
                f"{fmt(t1, '.3f')} ms -> {fmt(t2, '.3f')} ms ({R.kernel(s['name'], 'auto', 'f32', n2)})")

    # --- ONNX Runtime (not on this machine)
    add("f32 prefill vs ONNX Runtime MLAS (1,8,4096,4096,128)", None, "<=", "223 ms (issue 9, SPR)",
        "onnxruntime is not installed here: compare with the issue's number by hand", verdict="not run")

    # --- per-ISA rows (separate processes): reduced dtypes against f32 on the same ISA
    for isa in R.isas():
        if isa == "native":
            continue
        for s in R.shapes(isa):
            f32_ms = R.ms(s["name"], "auto", "f32", n2, isa)
            prev_ms = R.ms(s["name"], "prev-0.3:auto", "f32", n2, isa)
            if R.get(s["name"], "prev-0.3:auto", "f32", n2, isa) is not None:
                add(f"ISA {isa} f32 vs 0.3 {s['name']} ({n2}t): auto ours / 0.3",
                    f32_ms / prev_ms if f32_ms and prev_ms else None, "<=", round(1 + prev_allowance, 3),
                    f"ours {fmt(f32_ms, '.4f')} ms ({R.kernel(s['name'], 'auto', 'f32', n2, isa)}), 0.3 "
                    f"{fmt(prev_ms, '.4f')} ms ({R.kernel(s['name'], 'prev-0.3:auto', 'f32', n2, isa)})")
            for dt in ("bf16", "f16kv", "bf16kv"):
                r = R.get(s["name"], "auto", dt, n2, isa)
                if r is None:
                    continue
                lib = R.ms(s["name"], "auto", dt, n2, isa)
                nr = lib_not_run(s["name"], dt, n2, isa)
                add(f"ISA {isa} {s['name']} {dt}: our f32 time / {dt} time ({n2}t)",
                    f32_ms / lib if f32_ms and lib else None, "", "",
                    f"f32 {fmt(f32_ms, '.3f')} ms ({R.kernel(s['name'], 'auto', 'f32', n2, isa)}), {dt} "
                    f"{fmt(lib, '.3f')} ms ({R.kernel(s['name'], 'auto', dt, n2, isa)})", verdict=nr or "info")

    # --- torch bf16 (context)
    if torch_rows:
        for s in shapes:
            tb = [r for r in torch_rows if r["shape"] == s["name"] and r.get("dtype") == "bf16"]
            if not tb:
                continue
            best = min(tb, key=lambda r: float(r["median_ms"]))
            lib = R.ms(s["name"], "auto", "bf16")
            nr = lib_not_run(s["name"], "bf16")
            add(f"bf16 prefill {s['name']}: torch bf16 best time / our bf16 time ({n2}t)",
                float(best["median_ms"]) / lib if lib else None, "", "",
                f"torch {float(best['median_ms']):.1f} ms ({best['impl']}@{best['setting']}), ours {fmt(lib, '.1f')} "
                f"ms ({R.kernel(s['name'], 'auto', 'bf16')})", verdict=nr or "info")
    return res


# ------------------------------------------------------------------------------ issue 10

SERVING_KINDS = ("paged", "mixed", "sinkalibi", "pool")  # sdpa-bench's serving rows (issue 10)
PAGED_GOAL, MIXED_FLOOR_GOAL, FEATURE_GOAL, POOL_GOAL = 1.1, 1.1, 1.05, 1.2
# A kernel that reads all of K and V cannot beat one plain read of the same bytes by much (its
# prefetch gives it a few percent at most): a ratio above this is a broken floor measurement.
FLOOR_SANE = 1.25
SMALL_SCALING_GOAL = 1.3  # issue 9: 2 threads >= 1.3x 1 thread at (1,8,128,128,64)
ALIBI_RSS_MIN_BOUND = 256 * 1024  # bytes; below this the RSS probe's page-level noise dominates


def targets_issue10(bench_rows, n2=2):
    """Issue 10 (0.5 serving) targets from sdpa-bench's serving rows, native ISA, n2 threads:
    list of (target, measured, goal, verdict, detail)."""
    R = Rows(bench_rows)
    res = []
    shapes = [s for s in R.shapes() if s["kind"] in SERVING_KINDS]

    def spread(r):
        return f"{r['median_ms']} ms ({r['min_ms']}..{r['max_ms']}, {r['reps']} calls)"

    def row_problem(shape, path, dtype="f32", n=n2):
        """None when the row is there and ok; else the 'not run (...)' verdict."""
        r = R.get(shape, path, dtype, n)
        if r is None:
            return f"not run (no {path} row for {shape} {dtype} at {n} threads)"
        if r["status"] == "ok":
            return None
        return f"not run ({path}: {r['status']}: {r.get('note', '')})"

    def add(name, value, op, thr, detail, verdict=None):
        goal = f"{op} {thr}" if op else "-"
        if verdict is not None:
            res.append((name, fmt(value), goal, verdict, detail))
            return
        if value is None:
            res.append((name, "-", goal, "not run (no value)", detail))
            return
        ok = value <= thr if op == "<=" else value < thr if op == "<" else value >= thr
        miss = "" if ok else f" (by {abs(value / thr - 1) * 100:.1f}%)"
        res.append((name, fmt(value), goal, ("pass" if ok else "MISS") + miss, detail))

    def ratio(shape, a, b, dtype="f32", n=n2):
        """(value, verdict-or-None) for median(a) / median(b)."""
        for path in (a, b):
            prob = row_problem(shape, path, dtype, n)
            if prob:
                return None, prob
        return R.ms(shape, a, dtype, n) / R.ms(shape, b, dtype, n), None

    def fastest(shape, a, b, dtype="f32", n=n2):
        """The same ratio over the fastest calls (robust to co-tenants, who only slow calls down)."""
        ra, rb = R.get(shape, a, dtype, n), R.get(shape, b, dtype, n)
        x, y = (_f(ra["min_ms"]) if ra else None), (_f(rb["min_ms"]) if rb else None)
        return f"fastest calls {a} / {b} {fmt(x / y if x and y else None)}"

    def desc(shape, path, dtype="f32", n=n2):
        r = R.get(shape, path, dtype, n)
        if r is None:
            return f"{path}: missing"
        k = f" {r['kernel']}" if r["kernel"] not in ("-", "") else ""
        return f"{path}{k}: {spread(r) if r['status'] == 'ok' else r['status']}"

    def note_field(shape, path, key, dtype="f32", n=n2):
        r = R.get(shape, path, dtype, n)
        for f in (r.get("note", "") if r else "").split(";"):
            if f.startswith(key + "="):
                return f
        return None

    # --- paged decode vs dense decode on the same keys
    for want in ((1, 32, 1, 4096, 128), (8, 32, 1, 1024, 128)):
        names = [s["name"] for s in shapes if s["kind"] == "paged" and
                 (s["B"], s["H"], s["L"], s["S"], s["E"]) == want]
        for dt in ("f32", "f16kv", "bf16kv"):
            label = f"paged decode {'x'.join(map(str, want))} bs16 {dt}: paged / dense time ({n2}t)"
            if not names:
                add(label, None, "<=", PAGED_GOAL, "", verdict="not run (no paged rows: sdpa-bench --shapes paged-)")
                continue
            name = names[0]
            v, prob = ratio(name, "paged", "dense", dt)
            bits = note_field(name, "paged", "same_bits_as_dense", dt) or "-"
            fl = R.ms(name, "bw-floor", dt)
            pg = R.ms(name, "paged", dt)
            add(label, v, "<=", PAGED_GOAL,
                f"{desc(name, 'paged', dt)}; {desc(name, 'dense', dt)}; bw-floor {fmt(fl, '.3f')} ms "
                f"(paged / floor {fmt(pg / fl if pg and fl else None)}); {fastest(name, 'paged', 'dense', dt)}; {bits}",
                verdict=prob)
            # How much of the gap is the memory system's: a read of the same block runs in the
            # kernel's order, each prefetching the next (bw-floor-paged), against the contiguous
            # read (bw-floor).
            fp = R.ms(name, "bw-floor-paged", dt)
            if fp:
                add(f"paged decode {'x'.join(map(str, want))} bs16 {dt}: paged-runs read / contiguous read ({n2}t)",
                    fp / fl if fl else None, "", "",
                    f"bw-floor-paged {fmt(fp, '.3f')} ms, bw-floor {fmt(fl, '.3f')} ms; paged kernel / paged-runs read "
                    f"{fmt(pg / fp if pg else None)}", verdict="info")

    # --- the mixed batch: one packed call vs the floors and vs the per-sequence calls
    mixed = [s for s in shapes if s["kind"] == "mixed"]
    if not mixed:
        for label, op, goal in (("mixed batch: packed / (prefill BLAS floor + decode bw floor)", "<=",
                                 MIXED_FLOOR_GOAL), ("mixed batch: packed / per-sequence calls", "<", 1.0)):
            add(f"{label} ({n2}t)", None, op, goal, "", verdict="not run (no mixed rows: sdpa-bench --shapes mixed-)")
    for s in mixed:
        name = s["name"]
        pk = R.ms(name, "packed")
        probs = [row_problem(name, p) for p in ("packed", "blas-floor-prefill", "bw-floor-decode")]
        prob = next((p for p in probs if p), None)
        bl, bw = R.ms(name, "blas-floor-prefill"), R.ms(name, "bw-floor-decode")
        add(f"mixed batch {name}: packed / (prefill BLAS floor + decode bw floor) ({n2}t)",
            pk / (bl + bw) if pk and bl and bw else None, "<=", MIXED_FLOOR_GOAL,
            f"{desc(name, 'packed')} (keys packed, cu_seqlens_k); floors: blas-floor-prefill {fmt(bl, '.3f')} ms + "
            f"bw-floor-decode {fmt(bw, '.3f')} ms = {fmt(bl + bw if bl and bw else None, '.3f')} ms", verdict=prob)
        v, prob = ratio(name, "packed", "per-seq")
        add(f"mixed batch {name}: packed / per-sequence calls ({n2}t)", v, "<", 1.0,
            f"{desc(name, 'packed')}; {desc(name, 'per-seq')}; {fastest(name, 'packed', 'per-seq')}; "
            f"{note_field(name, 'packed', 'same_bits_as_per-seq') or '-'}", verdict=prob)
        v, prob = ratio(name, "packed-paged", "packed")
        add(f"mixed batch {name}: packed-paged / packed ({n2}t)", v, "", "",
            f"{desc(name, 'packed-paged')} (block size 16, random order); "
            f"{note_field(name, 'packed-paged', 'same_bits_as_per-seq') or '-'}", verdict=prob or "info")

    # --- sinks and ALiBi: cost over the same call without them; ALiBi's memory
    feats = [s for s in shapes if s["kind"] == "sinkalibi"]
    if not feats:
        add(f"sinks / ALiBi: cost over the plain call ({n2}t)", None, "<=", FEATURE_GOAL, "",
            verdict="not run (no sinkalibi rows: sdpa-bench --shapes sinkalibi-)")
    for s in feats:
        name = s["name"]
        for path, goal in (("sinks", FEATURE_GOAL), ("alibi", FEATURE_GOAL), ("sinks+alibi", None)):
            v, prob = ratio(name, path, "plain")
            add(f"{name}: {path} / plain time ({n2}t)", v, "<=" if goal else "", goal or "",
                f"{desc(name, path)}; {desc(name, 'plain')}; {fastest(name, path, 'plain')}",
                verdict=prob or (None if goal else "info"))
        ra, rp = R.get(name, "alibi", "f32", n2), R.get(name, "plain", "f32", n2)
        bound = max(s["L"] * s["S"] * 4 // 2, ALIBI_RSS_MIN_BOUND)
        materialised = s["B"] * s["H"] * s["L"] * s["S"] * 4
        label = f"{name}: ALiBi peak RSS growth over plain, MiB ({n2}t)"
        prob = row_problem(name, "alibi") or row_problem(name, "plain")
        ga = _f(ra["rss_growth_bytes"]) if ra else None
        gp = _f(rp["rss_growth_bytes"]) if rp else None
        if not prob and (ga is None or gp is None):
            prob = "not run (RSS probe unavailable: /proc/self/clear_refs not writable)"
        wa = _f(ra["ws_bytes"]) if ra else None
        wp = _f(rp["ws_bytes"]) if rp else None
        add(label, (ga - gp) / 1048576 if ga is not None and gp is not None else None, "<=",
            round(bound / 1048576, 3),
            f"alibi {fmt(ga / 1048576 if ga is not None else None)} MiB, plain "
            f"{fmt(gp / 1048576 if gp is not None else None)} MiB; workspace alibi - plain "
            f"{fmt((wa - wp) / 1048576 if wa is not None and wp is not None else None)} MiB; goal: half of one [L, S] "
            f"float32 matrix (at least {ALIBI_RSS_MIN_BOUND // 1024} KiB); a materialised B*H*L*S bias is "
            f"{materialised / 1048576:.2f} MiB", verdict=prob)

    # The same decode shape on a caller pool (no thread started per call): how much of a decode
    # row's distance to its floor is the per-call thread start-up, not the stream (info only).
    for s in shapes:
        if s["kind"] != "pool" or (s["B"], s["H"], s["L"], s["S"], s["E"]) != (1, 32, 1, 4096, 128):
            continue
        name = s["name"]
        for dt in ("f32", "f16kv", "bf16kv"):
            if R.get(name, "threadpool-warm", dt) is None:
                continue
            bw = R.ms(name, "bw-floor", dt)
            for var in ("threadpool", "threadpool-warm"):
                t = R.ms(name, var, dt)
                prob = row_problem(name, var, dt)
                if not prob and bw and t and bw / t > FLOOR_SANE:
                    prob = (f"invalid (the floor measured {bw / t:.2f}x the kernel it bounds: the "
                            f"floor's calls were slowed by noise; rerun)")
                add(f"decode {name} {dt} on a caller pool ({var}): bw-floor time / time ({n2}t)",
                    bw / t if bw and t else None, "", "",
                    f"{desc(name, var, dt)}; floor {fmt(bw, '.3f')} ms; builtin {fmt(R.ms(name, 'builtin', dt), '.3f')} ms",
                    verdict=prob or "info")

    # --- a caller thread pool on a small decode call vs its bandwidth floor
    pools = [s for s in shapes if s["kind"] == "pool" and (s["B"], s["H"], s["L"], s["S"], s["E"]) ==
             (1, 32, 1, 256, 128)]
    if not pools:
        add(f"caller pool decode 1x32x1x256x128: threadpool / bw floor ({n2}t)", None, "<=", POOL_GOAL, "",
            verdict="not run (no pool rows: sdpa-bench --shapes pool-)")
    for s in pools:
        name = s["name"]
        floors = [(R.ms(name, "bw-floor", "f32", n), n) for n in sorted({1, n2})]
        floors = [f for f in floors if f[0] is not None]
        fl = min(floors) if floors else None
        prob = row_problem(name, "threadpool") or (None if fl else "not run (no bw-floor row)")
        tp, bi = R.ms(name, "threadpool"), R.ms(name, "builtin")
        fdesc = ", ".join(f"{n}t {m:.4f} ms" for m, n in floors)
        add(f"caller pool decode {name}: threadpool / bw floor ({n2}t)", tp / fl[0] if tp and fl else None, "<=",
            POOL_GOAL, f"{desc(name, 'threadpool')}; floor = the faster of bw-floor ({fdesc}); "
                       f"{note_field(name, 'threadpool', 'same_bits_as_builtin') or '-'}", verdict=prob)
        tw = R.ms(name, "threadpool-warm")
        prob = row_problem(name, "threadpool-warm") or (None if fl else "not run (no bw-floor row)")
        add(f"caller pool decode {name}: threadpool, back-to-back calls / bw floor ({n2}t)",
            tw / fl[0] if tw and fl else None, "<=", POOL_GOAL,
            f"{desc(name, 'threadpool-warm')}; the previous call on the pool just ended (its workers still "
            f"poll, SDPA_POOL_SPIN_US), the timed call's bytes flushed like the others'; "
            f"{note_field(name, 'threadpool-warm', 'same_bits_as_builtin') or '-'}", verdict=prob)
        prob = row_problem(name, "builtin") or (None if fl else "not run (no bw-floor row)")
        add(f"caller pool decode {name}: built-in per-call threads / bw floor ({n2}t)",
            bi / fl[0] if bi and fl else None, "", "", desc(name, "builtin"), verdict=prob or "info")
        v, prob = ratio(name, "builtin", "threadpool")
        add(f"caller pool decode {name}: built-in / threadpool time ({n2}t)", v, "", "",
            f"the per-call thread start-up the pool saves; {fastest(name, 'builtin', 'threadpool')}",
            verdict=prob or "info")
    # The small prefill of the issue-9 scaling row under a caller pool (threads already exist):
    # what 2 threads buy once no thread is started per call (the cache is flushed before each call).
    for s in shapes:
        if s["kind"] == "pool" and (s["B"], s["H"], s["L"], s["S"], s["E"]) == (1, 8, 128, 128, 64):
            name = s["name"]
            t1, t2 = R.ms(name, "threadpool", "f32", 1), R.ms(name, "threadpool", "f32", n2)
            b1, b2 = R.ms(name, "builtin", "f32", 1), R.ms(name, "builtin", "f32", n2)
            add(f"small prefill {name} with a caller pool: t(1t) / t({n2}t)", t1 / t2 if t1 and t2 else None, "", "",
                f"threadpool {fmt(t1, '.4f')} ms -> {fmt(t2, '.4f')} ms; built-in threads {fmt(b1, '.4f')} ms -> "
                f"{fmt(b2, '.4f')} ms ({R.kernel(name, 'threadpool', 'f32', n2)})", verdict="info")
            w1, w2 = R.ms(name, "threadpool-warm", "f32", 1), R.ms(name, "threadpool-warm", "f32", n2)
            prob = row_problem(name, "threadpool-warm")
            add(f"small prefill {name}, caller pool, back-to-back calls: t(1t) / t({n2}t)",
                w1 / w2 if w1 and w2 else None, ">=", SMALL_SCALING_GOAL,
                f"threadpool-warm {fmt(w1, '.4f')} ms -> {fmt(w2, '.4f')} ms (the issue-9 small-shape scaling goal "
                f"met where threads exist and poll; built-in per-call threads above)", verdict=prob)
    return res


def format_targets(res, title=None):
    lines = ([f"### {title}", ""] if title else []) + ["| target | measured | goal | verdict | detail |",
                                                       "|---|---|---|---|---|"]
    for name, val, goal, verdict, detail in res:
        lines.append(f"| {name} | {val} | {goal} | {verdict} | {detail} |")
    count = {}
    for r in res:
        v = r[3].split(" ")[0] if not r[3].startswith("not run") else "not run"
        count[v] = count.get(v, 0) + 1
    lines.append("")
    lines.append("TARGETS: " + ", ".join(f"{count.get(k, 0)} {k}" for k in ("pass", "MISS", "n/a", "not run", "info"))
                 + (f", {count['invalid']} invalid" if count.get("invalid") else ""))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="sdpa-bench --csv files of one run (one per ISA process)")
    ap.add_argument("--torch", help="torch.csv written by compare_torch.py")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    rows = []
    for p in args.csv:
        with open(p, newline="") as f:
            rows += list(csv.DictReader(f))
    trows = None
    if args.torch:
        with open(args.torch, newline="") as f:
            trows = list(csv.DictReader(f))
    print(format_targets(targets_issue9(rows, trows, args.threads), "issue 9 (0.4) targets"))
    print()
    print(format_targets(targets_issue10(rows, args.threads), "issue 10 (0.5) targets"))


if __name__ == "__main__":
    sys.exit(main())
