#!/usr/bin/env python3
"""Compare sdpa-bench's rows with PyTorch (CPU) on the same shapes and thread counts.

    /usr/bin/python3 bench/compare_torch.py --bench build/bench/sdpa-bench [--out-dir bench/results]
        [--baseline build|PATH|none] [--isa-runs 'avx2:SHAPES;portable:SHAPES'|none]
    /usr/bin/python3 bench/compare_torch.py --bench-csv results/sdpa_bench*.csv     # reuse a run
    /usr/bin/python3 bench/compare_torch.py --bench-csv X.csv --no-torch            # targets only

Steps:
 1. sdpa-bench's CSV: read --bench-csv (one file per ISA process), or run --bench with --csv
    (passing --threads, --reps, --shapes, --dtypes, --baseline); written to OUT/sdpa_bench.csv.
    --baseline build first runs bench/build_baseline.sh (the 0.3 library, commit 26b3d60) and
    passes its path, so the prev-0.3 candidates run in the same process. Then, for every
    ISA:SHAPES entry of --isa-runs, one more sdpa-bench process with SDPA_MAX_ISA=ISA on those
    shapes (the library reads SDPA_MAX_ISA once per process), written to
    OUT/sdpa_bench_isa-ISA.csv.
 2. PyTorch on every f32 shape of the native run, two formulations:
      torch-sdpa  torch.nn.functional._scaled_dot_product_attention(q, k, v, None, 0.0, False,
                  is_causal) (torch 1.13; on CPU it runs aten::_scaled_dot_product_attention_math,
                  which also forms the [B, H, L, S] weights);
      torch-math  softmax(q @ k^T * scale + mask) @ v, the mask a precomputed additive [L, S]
                  (-inf above the diagonal) for causal shapes;
    at PyTorch's default thread setting (no set_num_threads: torch.get_num_threads() at start)
    and at torch.set_num_threads(n) for n in the thread list, under torch.no_grad(). Same scheme
    as sdpa-bench: warm-up, one untimed call probing peak RSS growth, then the configurations
    round-robin, medians; cheap shapes get more repetitions (--min-time-ms). The two
    formulations are checked against each other (max abs diff).
    "PyTorch default" = the faster formulation at the default setting; "PyTorch best" = the
    fastest (formulation, thread setting) of all. The same two formulations in bfloat16
    (q, k, v bf16; torch's CPU bf16 matmuls run through oneDNN) on every shape the run has bf16
    rows for (--torch-dtypes). Raw rows: OUT/torch.csv (column dtype).
 3. OUT/combined.csv: per (shape, threads) the library's f32 rows next to PyTorch's f32 rows,
    with ratios = library time / PyTorch time (below 1: the library is faster).
 4. OUT/gflops.png (plot.py, f32 rows) and the TARGETS of issue 4, of issue 9 section 5 and of
    issue 10 (targets.py; printed, and written to OUT/targets.md), library = the AUTO rows (issue
    10: the serving rows, paged-/mixed-/sinkalibi-/pool-, which PyTorch, combined.csv and the
    plot leave out).
"""
import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The issue-10 serving rows (paged, mixed, sinkalibi, pool) have their own table (targets.py).
SERVING_KINDS = ("paged", "mixed", "sinkalibi", "pool")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fnum(s):
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def f32_native(bench_rows):
    """The rows of the issue-4 tables and the plot: f32 storage, no SDPA_MAX_ISA cap, no probe."""
    return [r for r in bench_rows if (r.get("dtype") or "f32") == "f32" and (r.get("isa_cap") or "native") == "native"
            and r["kind"] != "peak" and r["kind"] not in SERVING_KINDS]


def shape_list(bench_rows):
    seen, shapes = set(), []
    for r in f32_native(bench_rows):
        if r["shape"] not in seen:
            seen.add(r["shape"])
            shapes.append({"name": r["shape"], "kind": r["kind"], "B": int(r["B"]), "H": int(r["H"]),
                           "L": int(r["L"]), "S": int(r["S"]), "E": int(r["E"]), "causal": int(r["causal"])})
    return shapes


def flops(s):
    dense = 4.0 * s["B"] * s["H"] * s["L"] * s["S"] * s["E"]
    return dense


# ----------------------------------------------------------------------------- memory probe

def _status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def rss_probe_begin():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_kib("VmRSS")


def rss_probe_end(before):
    if before is None:
        return None
    hwm = _status_kib("VmHWM")
    return max(0, hwm - before) * 1024 if hwm is not None else None


# ------------------------------------------------------------------------------ torch runs

def run_torch(shapes, threads, reps, warmup, min_time_ms, log, dtype="f32"):
    import torch
    import torch.nn.functional as F

    default_threads = torch.get_num_threads()  # before any set_num_threads: what a user gets
    settings = [("default", default_threads)] + [(str(n), n) for n in threads]
    # A setting equal to the default one is measured once and reported under both names.
    measured = []
    for label, n in settings:
        if not any(m[1] == n for m in measured):
            measured.append((label, n))
    alias = {label: next(m[0] for m in measured if m[1] == n) for label, n in settings}
    try:  # the OpenBLAS that torch's CPU matmuls load (Debian: BLAS_INFO=generic -> libblas/OpenBLAS)
        import ctypes
        ob = ctypes.CDLL("libopenblas.so.0")
        ob.openblas_get_corename.restype = ctypes.c_char_p
        core = ob.openblas_get_corename().decode()
    except (OSError, AttributeError):
        core = "unknown"
    log(f"# torch {torch.__version__}: OpenBLAS core {core} (OPENBLAS_CORETYPE="
        f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')}), default threads {default_threads} "
        f"(parallel backend: {torch.__config__.parallel_info().splitlines()[-1].strip()}); "
        f"settings measured: {', '.join(f'{lab}={n}' for lab, n in measured)}")

    def sdpa_fn(q, k, v, causal, mask):
        return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, bool(causal))[0]

    def math_fn(q, k, v, causal, mask):
        s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        if mask is not None:
            s = s + mask
        return torch.matmul(torch.softmax(s, dim=-1), v)

    forms = [("torch-sdpa", sdpa_fn), ("torch-math", math_fn)]
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    rows = []
    torch.manual_seed(0)
    for s in shapes:
        B, H, L, S, E = s["B"], s["H"], s["L"], s["S"], s["E"]
        q = (torch.rand(B, H, L, E) * 2 - 1).to(tdt)
        k = (torch.rand(B, H, S, E) * 2 - 1).to(tdt)
        v = (torch.rand(B, H, S, E) * 2 - 1).to(tdt)
        mask = None
        if s["causal"]:
            mask = torch.full((L, S), float("-inf")).triu(1).to(tdt)
        cands = [(f, fn, lab, n) for (lab, n) in measured for (f, fn) in forms]
        times = {(f, lab): [] for (f, _, lab, _) in cands}
        rss = {}
        outs = {}
        slowest = 0.0
        with torch.no_grad():
            for f, fn, lab, n in cands:
                torch.set_num_threads(n)
                for _ in range(warmup):
                    fn(q, k, v, s["causal"], mask)
                before = rss_probe_begin()
                t0 = time.perf_counter()
                o = fn(q, k, v, s["causal"], mask)
                t = (time.perf_counter() - t0) * 1e3
                rss[(f, lab)] = rss_probe_end(before)
                slowest = max(slowest, t)
                if lab == measured[0][0]:
                    outs[f] = o
                del o
            diff = (outs["torch-sdpa"].float() - outs["torch-math"].float()).abs().max().item()
            del outs
            nrep = reps
            if min_time_ms > 0 and slowest > 0:
                nrep = max(reps, min(100, math.ceil(min_time_ms / slowest)))
            for r in range(nrep):
                for j in range(len(cands)):
                    f, fn, lab, n = cands[(j + r) % len(cands)]
                    torch.set_num_threads(n)
                    t0 = time.perf_counter()
                    fn(q, k, v, s["causal"], mask)
                    times[(f, lab)].append((time.perf_counter() - t0) * 1e3)
        torch.set_num_threads(default_threads)
        for label, n in settings:
            for f, _ in forms:
                ts = times[(f, alias[label])]
                med = statistics.median(ts)
                row = {"shape": s["name"], "dtype": dtype, "impl": f, "setting": label, "threads": n,
                       "reps": len(ts),
                       "median_ms": f"{med:.4f}", "min_ms": f"{min(ts):.4f}", "max_ms": f"{max(ts):.4f}",
                       "gflops_dense": f"{flops(s) / (med * 1e6):.2f}",
                       "gbps": f"{2 * B * H * S * E * q.element_size() / (med * 1e6):.2f}" if L <= 4 else "-",
                       "rss_growth_bytes": rss[(f, alias[label])] if rss[(f, alias[label])] is not None else "-",
                       "max_abs_diff_sdpa_vs_math": f"{diff:.3g}",
                       "note": f"same_measurement_as_{alias[label]}" if alias[label] != label else "-"}
                rows.append(row)
                log(f"{s['name']:<30} {f:<11} {dtype:<5} {label:>8} {n:>3} {len(ts):>4} {med:>11.4f} "
                    f"{row['gflops_dense']:>9} {row['gbps']:>8} "
                    f"{(row['rss_growth_bytes'] / 1048576 if row['rss_growth_bytes'] != '-' else float('nan')):>9.2f} "
                    f"{row['max_abs_diff_sdpa_vs_math']:>9}")
    return rows, default_threads


TORCH_FIELDS = ["shape", "dtype", "impl", "setting", "threads", "reps", "median_ms", "min_ms", "max_ms", "gflops_dense",
                "gbps", "rss_growth_bytes", "max_abs_diff_sdpa_vs_math", "note"]


# --------------------------------------------------------------------------------- combine

def index_bench(bench_rows):
    return {(r["shape"], r["path"], int(r["threads"])): r for r in f32_native(bench_rows)}


def bench_ms(bidx, shape, path, n):
    r = bidx.get((shape, path, n))
    if r is None or r["status"] != "ok":
        return None
    return fnum(r["median_ms"])


def torch_summary(torch_rows):
    """Per shape: {'default': (ms, impl), 'best': (ms, 'impl@setting'), 'n': {n: (ms, impl)}}."""
    out = {}
    for r in torch_rows:
        if (r.get("dtype") or "f32") != "f32":
            continue
        d = out.setdefault(r["shape"], {"default": None, "best": None, "n": {}})
        ms = float(r["median_ms"])
        if r["setting"] == "default":
            if d["default"] is None or ms < d["default"][0]:
                d["default"] = (ms, r["impl"])
        else:
            n = int(r["threads"])
            if n not in d["n"] or ms < d["n"][n][0]:
                d["n"][n] = (ms, r["impl"])
        if d["best"] is None or ms < d["best"][0]:
            d["best"] = (ms, f"{r['impl']}@{r['setting']}")
    return out


def combine(bench_rows, torch_rows, threads):
    bidx = index_bench(bench_rows)
    tsum = torch_summary(torch_rows) if torch_rows else {}
    out = []
    for s in shape_list(bench_rows):
        name = s["name"]
        for n in threads:
            auto = bidx.get((name, "auto", n))
            if auto is None:
                continue
            lib = bench_ms(bidx, name, "auto", n)
            t = tsum.get(name)
            row = {"shape": name, "kind": s["kind"], "threads": n, "lib_path": "auto",
                   "lib_kernel": auto["kernel"], "lib_status": auto["status"], "lib_ms": fmt(lib),
                   "blas_floor_ms": fmt(bench_ms(bidx, name, "blas-floor", n)),
                   "reference_ms": fmt(bench_ms(bidx, name, "reference", n)),
                   "tiled_ms": fmt(bench_ms(bidx, name, "tiled", n)),
                   "decode_ms": fmt(bench_ms(bidx, name, "decode", n)),
                   "bw_floor_ms": fmt(bench_ms(bidx, name, "bw-floor", n))}
            tn = t["n"].get(n) if t else None
            td = t["default"] if t else None
            tb = t["best"] if t else None
            row.update({"torch_n_ms": fmt(tn[0] if tn else None), "torch_n_impl": tn[1] if tn else "-",
                        "torch_default_ms": fmt(td[0] if td else None), "torch_default_impl": td[1] if td else "-",
                        "torch_best_ms": fmt(tb[0] if tb else None), "torch_best_impl": tb[1] if tb else "-",
                        "ratio_lib_over_torch_n": ratio(lib, tn[0] if tn else None),
                        "ratio_lib_over_torch_default": ratio(lib, td[0] if td else None),
                        "ratio_lib_over_torch_best": ratio(lib, tb[0] if tb else None),
                        "ratio_lib_over_blas_floor": ratio(lib, bench_ms(bidx, name, "blas-floor", n))})
            out.append(row)
    return out


COMBINED_FIELDS = ["shape", "kind", "threads", "lib_path", "lib_kernel", "lib_status", "lib_ms", "blas_floor_ms",
                   "reference_ms", "tiled_ms", "decode_ms", "bw_floor_ms", "torch_n_ms", "torch_n_impl",
                   "torch_default_ms", "torch_default_impl", "torch_best_ms", "torch_best_impl",
                   "ratio_lib_over_torch_n", "ratio_lib_over_torch_default", "ratio_lib_over_torch_best",
                   "ratio_lib_over_blas_floor"]


def fmt(v, spec=".4f"):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.3f}"


# --------------------------------------------------------------------------------- targets

def targets(bench_rows, torch_rows, main_threads=2):
    """Issue 4's targets from one run: (target, measured, threshold, verdict, detail)."""
    bidx = index_bench(bench_rows)
    tsum = torch_summary(torch_rows) if torch_rows else {}
    shapes = shape_list(bench_rows)
    res = []

    def add(name, value, op, thr, detail):
        if value is None:
            res.append((name, "-", f"{op} {thr}", "n/a", detail))
            return
        ok = value <= thr if op == "<=" else value >= thr if op == ">=" else value < thr
        res.append((name, f"{value:.3f}", f"{op} {thr}", "pass" if ok else "MISS", detail))

    n2 = main_threads

    def auto(name, n=n2):
        return bench_ms(bidx, name, "auto", n)

    def kern(name, n=n2):
        r = bidx.get((name, "auto", n))
        return r["kernel"] if r else "-"

    for s in shapes:
        if s["kind"] in ("dense", "memory") and s["L"] == s["S"] and s["L"] >= 1024:
            lib, fl = auto(s["name"]), bench_ms(bidx, s["name"], "blas-floor", n2)
            add(f"dense {s['name']}: time / BLAS floor ({n2}t)", lib / fl if lib and fl else None, "<=", 1.10,
                f"auto {fmt(lib, '.1f')} ms ({kern(s['name'])}), floor {fmt(fl, '.1f')} ms")
    for s in shapes:
        if s["kind"] == "causal" and s["L"] == 2048:
            dense = next((d for d in shapes if d["kind"] == "dense" and
                          (d["B"], d["H"], d["L"], d["S"], d["E"]) == (s["B"], s["H"], s["L"], s["S"], s["E"])), None)
            lc, ld = auto(s["name"]), auto(dense["name"]) if dense else None
            add(f"causal {s['name']}: time / own dense ({n2}t)", lc / ld if lc and ld else None, "<=", 0.55,
                f"causal {fmt(lc, '.1f')} ms, dense {fmt(ld, '.1f')} ms")
    for s in shapes:
        if s["kind"] == "decode" and (s["B"], s["H"], s["S"], s["E"]) == (1, 32, 4096, 128):
            lib, bw = auto(s["name"]), bench_ms(bidx, s["name"], "bw-floor", n2)
            add(f"decode {s['name']}: bandwidth / bw floor ({n2}t)", bw / lib if lib and bw else None, ">=", 0.80,
                f"auto {fmt(lib, '.3f')} ms ({kern(s['name'])}), bw floor {fmt(bw, '.3f')} ms")
    for s in shapes:
        if s["kind"] in ("dense", "causal", "memory") and s["L"] >= 1024:
            t1, t2 = auto(s["name"], 1), auto(s["name"], n2)
            add(f"scaling {s['name']}: t(1t) / t({n2}t)", t1 / t2 if t1 and t2 else None, ">=", 1.7,
                f"{fmt(t1, '.1f')} ms -> {fmt(t2, '.1f')} ms")
    for s in shapes:
        if (s["kind"], s["B"], s["H"], s["L"], s["S"], s["E"]) == ("dense", 1, 8, 128, 128, 64):
            t1, t2 = auto(s["name"], 1), auto(s["name"], n2)
            add(f"small {s['name']}: t(1t) / t({n2}t)", t1 / t2 if t1 and t2 else None, ">=", 1.0,
                f"{fmt(t1, '.3f')} ms -> {fmt(t2, '.3f')} ms")
    for s in shapes:
        if s["kind"] in ("dense", "causal", "cross", "memory"):
            lib = auto(s["name"])
            t = tsum.get(s["name"])
            td, tb = (t["default"], t["best"]) if t else (None, None)
            add(f"vs PyTorch default {s['name']}: speed-up ({n2}t)",
                td[0] / lib if lib and td else None, ">=", 1.5,
                f"auto {fmt(lib, '.2f')} ms, torch {fmt(td[0] if td else None, '.2f')} ms "
                f"({td[1] if td else '-'})")
            add(f"vs PyTorch best {s['name']}: speed-up ({n2}t)",
                tb[0] / lib if lib and tb else None, ">=", 1.1,
                f"auto {fmt(lib, '.2f')} ms, torch {fmt(tb[0] if tb else None, '.2f')} ms "
                f"({tb[1] if tb else '-'})")
    for s in shapes:
        if s["kind"] == "memory":
            r = bidx.get((s["name"], "auto", n2))
            ws = fnum(r["ws_bytes"]) if r else None
            rss = fnum(r["rss_growth_bytes"]) if r else None
            vals = [v for v in (ws, rss) if v is not None]
            add(f"memory {s['name']}: peak extra MiB ({n2}t)", max(vals) / 1048576 if vals else None, "<", 64,
                f"workspace {fmt(ws / 1048576 if ws is not None else None, '.2f')} MiB, "
                f"RSS growth {fmt(rss / 1048576 if rss is not None else None, '.2f')} MiB")
    return res


def format_targets(res):
    lines = ["| target | measured | goal | verdict | detail |", "|---|---|---|---|---|"]
    for name, val, goal, verdict, detail in res:
        lines.append(f"| {name} | {val} | {goal} | {verdict} | {detail} |")
    npass = sum(1 for r in res if r[3] == "pass")
    nmiss = sum(1 for r in res if r[3] == "MISS")
    nna = sum(1 for r in res if r[3] == "n/a")
    lines.append("")
    lines.append(f"TARGETS: {npass} pass, {nmiss} miss, {nna} n/a")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ main

def write_csv(path, fields, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow(r)


DEFAULT_ISA_RUNS = ("avx2:dense-1x8x1024x1024x64,decode-1x32x1x4096x128;"
                    "portable:dense-1x8x1024x1024x64,decode-1x32x1x4096x128")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--bench", help="path to sdpa-bench: run it (with --csv)")
    src.add_argument("--bench-csv", nargs="+", help="reuse CSVs written by sdpa-bench --csv (one per ISA process)")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--min-time-ms", type=float, default=300.0)
    ap.add_argument("--shapes", default=None, help="passed to sdpa-bench --shapes (the native run)")
    ap.add_argument("--dtypes", default=None, help="passed to sdpa-bench --dtypes (default: all)")
    ap.add_argument("--baseline", default="none",
                    help="prev-0.3 candidates: 'build' (bench/build_baseline.sh builds 0.3 from git, ~10 s), "
                         "a path to a 0.3 libsdpa.so, or 'none' (default; sdpa-bench then uses its meson default)")
    ap.add_argument("--isa-runs", default=DEFAULT_ISA_RUNS,
                    help="'ISA:SHAPES;ISA:SHAPES': one more sdpa-bench process per entry with SDPA_MAX_ISA=ISA "
                         f"on those shapes; 'none' for no extra run (default: {DEFAULT_ISA_RUNS})")
    ap.add_argument("--torch-dtypes", default="f32,bf16",
                    help="PyTorch dtypes: f32 on every f32 shape, bf16 on the shapes with bf16 rows")
    ap.add_argument("--no-torch", action="store_true", help="only the library's targets from the CSV")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    threads = [int(x) for x in args.threads.split(",")]
    os.makedirs(args.out_dir, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    t_start = time.time()
    bench_rows = []
    if args.bench:
        baseline = []
        if args.baseline == "build":
            r = subprocess.run(["sh", os.path.join(HERE, "build_baseline.sh")], stdout=subprocess.PIPE, text=True)
            if r.returncode != 0:
                sys.exit("bench/build_baseline.sh failed")
            baseline = ["--baseline", r.stdout.strip().splitlines()[-1]]
        elif args.baseline != "none":
            baseline = ["--baseline", args.baseline]
        runs = [("native", args.shapes, os.path.join(args.out_dir, "sdpa_bench.csv"))]
        if args.isa_runs and args.isa_runs != "none":
            for entry in args.isa_runs.split(";"):
                isa, _, shapes = entry.partition(":")
                runs.append((isa.strip(), shapes.strip() or None,
                             os.path.join(args.out_dir, f"sdpa_bench_isa-{isa.strip()}.csv")))
        for isa, shapes, csv_path in runs:
            cmd = [args.bench, "--csv", csv_path, "--threads", args.threads, "--reps", str(args.reps),
                   "--warmup", str(args.warmup), "--min-time-ms", str(args.min_time_ms)] + baseline
            if shapes:
                cmd += ["--shapes", shapes]
            if args.dtypes:
                cmd += ["--dtypes", args.dtypes]
            env = dict(os.environ)
            if isa != "native":
                env["SDPA_MAX_ISA"] = isa
            log(("" if isa == "native" else f"SDPA_MAX_ISA={isa} ") + "$ " + " ".join(cmd))
            r = subprocess.run(cmd, env=env)
            if r.returncode not in (0, 1):
                sys.exit(f"sdpa-bench failed with exit status {r.returncode}")
            if r.returncode == 1:
                log("# sdpa-bench reported failing rows (status column); continuing")
            bench_rows += read_csv(csv_path)
    else:
        for path in args.bench_csv:
            bench_rows += read_csv(path)
    t_bench = time.time() - t_start

    torch_rows = []
    torch_csv = os.path.join(args.out_dir, "torch.csv")
    if not args.no_torch:
        log(f"{'shape':<30} {'impl':<11} {'dtype':<5} {'setting':>8} {'thr':>3} {'reps':>4} {'median_ms':>11} "
            f"{'GF/s':>9} {'GB/s':>8} {'rss_MiB':>9} {'diff':>9}")
        tdts = args.torch_dtypes.split(",")
        if "f32" in tdts:
            torch_rows += run_torch(shape_list(bench_rows), threads, args.reps, args.warmup, args.min_time_ms,
                                    log)[0]
        if "bf16" in tdts:
            bf16_names = {r["shape"] for r in bench_rows if r.get("dtype") == "bf16"
                          and (r.get("isa_cap") or "native") == "native"}
            bf16_shapes = [s for s in shape_list(bench_rows) if s["name"] in bf16_names]
            if bf16_shapes:
                torch_rows += run_torch(bf16_shapes, threads, args.reps, args.warmup, args.min_time_ms, log,
                                        dtype="bf16")[0]
        write_csv(torch_csv, TORCH_FIELDS, torch_rows)
    elif os.path.exists(torch_csv) and args.bench_csv:
        torch_rows = read_csv(torch_csv)
        log(f"# using PyTorch rows of {torch_csv}")

    combined = combine(bench_rows, torch_rows, threads)
    write_csv(os.path.join(args.out_dir, "combined.csv"), COMBINED_FIELDS, combined)
    try:
        import plot
        import matplotlib  # noqa: F401  (plot.py imports it lazily)
    except ImportError as e:
        log(f"# plot not drawn: {e}")
        args.no_plot = True
    if not args.no_plot:
        plot.plot(f32_native(bench_rows), [r for r in torch_rows if (r.get("dtype") or "f32") == "f32"],
                  os.path.join(args.out_dir, "gflops.png"), threads)
    import targets as issue9
    res = targets(bench_rows, torch_rows, main_threads=max(threads))
    res9 = issue9.targets_issue9(bench_rows, torch_rows, n2=max(threads))
    res10 = issue9.targets_issue10(bench_rows, n2=max(threads))
    text = format_targets(res)
    text9 = issue9.format_targets(res9)
    text10 = issue9.format_targets(res10)
    with open(os.path.join(args.out_dir, "targets.md"), "w") as f:
        f.write("### issue 4 (0.1-0.3) targets\n\n" + text + "\n\n### issue 9 (0.4) targets\n\n" + text9 +
                "\n\n### issue 10 (0.5) targets\n\n" + text10 + "\n")
    log("")
    log(text)
    log("")
    log(text9)
    log("")
    log(text10)
    log(f"# wall time: sdpa-bench {t_bench:.0f} s, total {time.time() - t_start:.0f} s; outputs in {args.out_dir}")


if __name__ == "__main__":
    main()
