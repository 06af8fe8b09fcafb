#!/usr/bin/env python3
"""The bench_smoke test: run `sdpa-bench --smoke --csv FILE` and check what it printed.

- `sdpa-bench --self-test` passes (f16/bf16 conversions: every value round-trips, ties to even);
- the program exits 0 (it exits 1 itself when a library path fails or disagrees with the
  reference path beyond its tolerance);
- every stdout row has the 18 columns of the header, numbers where numbers belong;
- one row per (shape, path, dtype, threads) that the bench promises, at threads 1 and 2, for
  the dtype combinations `--smoke --list` names per shape:
    peak-fma: fma-avx512, fma-avx2;
    f32: blas-floor, reference, tiled, auto; bw-floor and decode for L <= 4; with --baseline
      also prev-0.3:tiled, prev-0.3:auto (prev-0.3:decode for L <= 4), none without it;
    f16kv / bf16kv / bf16: tiled, auto; bw-floor and decode for L <= 4;
- the CSV holds the same rows with the same status and kernel, and names each row's dtypes;
- status is ok or unsupported; the f32 reference and every prev-0.3 row: ok; an unsupported
  f16/bf16 row is one the library answers with SDPA_ERR_DTYPE, an unsupported fma row one the
  CPU lacks: both are counted and printed as "not run", not as passed;
- every ok library row agrees with the reference path and with the double-precision check
  within the row's tolerance (1e-4 for f32; for f16/bf16 the bench's dtype tolerance, at most
  2 * 2^-7), its kernel name is set; the FMA rows report GF/s > 0.
- the serving rows of issue 10 (cases named paged-..., mixed-..., sinkalibi-..., pool-...; their
  candidates in SERVING below) are all there at threads 1 and 2 for the dtypes --list names, ok,
  within tolerance of the reference path and the double-precision check (sinks, ALiBi, causal
  bottom-right per packed sequence included), with a kernel name; the floors have their GB/s or
  GF/s; and every row that must match another bit for bit (paged vs dense, packed and
  packed-paged vs per-seq, threadpool vs builtin: note same_bits_as_X) does.
A forced kernel whose reported name does not start with the path's name is printed as a
warning (the row shows which kernel really ran).

Usage: check_smoke.py path/to/sdpa-bench --baseline|--no-baseline
"""
import csv
import os
import shlex
import subprocess
import sys
import tempfile

TOL = 1e-4
TOL_REDUCED_MAX = 2 * 2.0 ** -7
THREADS = (1, 2)
COLUMNS = ["shape", "path", "dtype", "thr", "status", "kernel", "reps", "median_ms", "min_ms", "GF/s", "GF/s_eff",
           "GB/s", "cores", "ws_MiB", "rss_MiB", "diff_ref", "diff_naive", "note"]
NUMERIC = ["median_ms", "min_ms", "GF/s", "GF/s_eff", "GB/s", "cores", "ws_MiB", "rss_MiB", "diff_ref", "diff_naive"]
LIBRARY = ("reference", "tiled", "decode", "auto", "prev-0.3:tiled", "prev-0.3:decode", "prev-0.3:auto")
PREV = ("prev-0.3:tiled", "prev-0.3:auto")
# Issue 10 serving cases (sdpa_bench.c, sv_vars_of): kind -> (library candidates, floors).
SERVING = {
    "paged": (("dense", "paged"), ("bw-floor", "bw-floor-paged")),
    "mixed": (("packed", "packed-paged", "per-seq"), ("blas-floor-prefill", "bw-floor-decode")),
    "sinkalibi": (("plain", "sinks", "alibi", "sinks+alibi"), ()),
    "pool": (("builtin", "threadpool", "threadpool-warm"), ("bw-floor",)),
}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def num(s):
    return None if s == "-" else float(s)


def check_serving_row(row, c, where, not_run):
    """One row of an issue-10 serving case; returns 1 when it was checked as ok."""
    lib, floors = SERVING[row["shape"].split("-", 1)[0]]
    if row["status"] == "unsupported":
        # Only a reduced dtype the library answers with SDPA_ERR_DTYPE may be "not run".
        if row["dtype"] == "f32" or not row["note"].startswith("not_run:") or "SDPA_ERR_DTYPE" not in row["note"]:
            fail(f"{where}: this serving row must run ({row['note']})")
        not_run[row["dtype"]] = not_run.get(row["dtype"], 0) + 1
        return 0
    if row["reps"] < 2 or row["median_ms"] is None or row["median_ms"] < 0:
        fail(f"{where}: no timing")
    if row["path"] in floors:
        if row["path"].startswith("bw-floor") and row["GB/s"] is None:
            fail(f"{where}: no GB/s")
        if row["path"].startswith("blas-floor") and row["GF/s"] is None:
            fail(f"{where}: no GF/s")
        return 1
    if row["path"] not in lib:
        fail(f"{where}: unknown serving path")
    if row["kernel"] in ("-", "?"):
        fail(f"{where}: no kernel name")
    if row["GF/s"] is None or row["GF/s"] < 0:
        fail(f"{where}: no GFLOP/s")
    tol = TOL if row["dtype"] == "f32" else min(float(c["tol"]), TOL_REDUCED_MAX)
    for k in ("diff_ref", "diff_naive"):
        if row[k] is None or not row[k] <= tol:
            fail(f"{where}: {k} = {row[k]} exceeds {tol}")
    for field in row["note"].split(";"):
        if field.startswith("same_bits_as_") and not field.endswith("=1"):
            fail(f"{where}: the library promises the same bits as another row ({field})")
    if row["path"] in ("paged", "packed", "packed-paged", "threadpool", "threadpool-warm") and "same_bits_as_" not in row["note"]:
        fail(f"{where}: no bit-for-bit comparison in the note ({row['note']})")
    return 1


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("--baseline", "--no-baseline"):
        fail("usage: check_smoke.py path/to/sdpa-bench --baseline|--no-baseline")
    # A cross build (cross/aarch64.txt) runs the program under meson's exe wrapper (qemu).
    exe = shlex.split(os.environ.get("MESON_EXE_WRAPPER", "")) + [sys.argv[1]]
    baseline = sys.argv[2] == "--baseline"
    st = subprocess.run(exe + ["--self-test"], capture_output=True, text=True, timeout=60)
    print(st.stdout, end="")
    print(st.stderr, end="", file=sys.stderr)
    if st.returncode != 0 or "conversions ok" not in st.stdout:
        fail("sdpa-bench --self-test failed")
    listing = subprocess.run(exe + ["--smoke", "--list"], capture_output=True, text=True, check=True).stdout
    cases = [ln.split() for ln in listing.splitlines() if ln.strip()]
    if not cases or any(len(c) < 2 for c in cases):
        fail("--smoke --list printed no shape, or a shape without dtypes")
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = os.path.join(tmp, "smoke.csv")
        r = subprocess.run(exe + ["--smoke", "--csv", csv_path], capture_output=True, text=True, timeout=100)
        print(r.stdout, end="")
        print(r.stderr, end="", file=sys.stderr)
        if r.returncode != 0:
            fail(f"sdpa-bench --smoke exited with {r.returncode}")
        with open(csv_path, newline="") as f:
            csv_rows = list(csv.DictReader(f))

    lines = [ln for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines or lines[0].split() != COLUMNS:
        fail("missing or malformed header line")
    rows = []
    for ln in lines[1:]:
        fields = ln.split()
        if len(fields) != len(COLUMNS):
            fail(f"row has {len(fields)} columns, want {len(COLUMNS)}: {ln!r}")
        row = dict(zip(COLUMNS, fields))
        try:
            row["thr"] = int(row["thr"])
            row["reps"] = int(row["reps"])
            for k in NUMERIC:
                row[k] = num(row[k])
        except ValueError as e:
            fail(f"non-numeric field in {ln!r}: {e}")
        rows.append(row)

    expected = set()
    for name, *dtypes in cases:
        if name == "peak-fma":
            expected |= {(name, p, "f32", t) for p in ("fma-avx512", "fma-avx2") for t in THREADS}
            continue
        if name.split("-", 1)[0] in SERVING:
            lib, floors = SERVING[name.split("-", 1)[0]]
            for dt in dtypes:
                paths = list(lib) + [p for p in floors if dt == "f32" or p != "blas-floor-prefill"]
                expected |= {(name, p, dt, t) for p in paths for t in THREADS}
            continue
        L = int(name.split("-", 1)[1].split("x")[2])
        for dt in dtypes:
            if dt == "f32":
                paths = ["blas-floor", "reference", "tiled", "auto"] + (["bw-floor", "decode"] if L <= 4 else [])
                if baseline:
                    paths += list(PREV) + (["prev-0.3:decode"] if L <= 4 else [])
            else:
                paths = ["tiled", "auto"] + (["bw-floor", "decode"] if L <= 4 else [])
            expected |= {(name, p, dt, t) for p in paths for t in THREADS}
    if not baseline and "# prev-0.3: not run" not in r.stdout:
        fail("without a baseline the header must say that prev-0.3 was not run")
    if baseline and "# prev-0.3: libsdpa 0.3." not in r.stdout:
        fail("a baseline was configured but the header does not name a loaded 0.3 library")
    got = [(r["shape"], r["path"], r["dtype"], r["thr"]) for r in rows]
    if len(got) != len(set(got)):
        fail("duplicate (shape, path, dtype, threads) rows")
    if set(got) != expected:
        fail(f"rows differ from the expected set: missing {sorted(expected - set(got))}, "
             f"extra {sorted(set(got) - expected)}")
    if len(csv_rows) != len(rows):
        fail(f"CSV has {len(csv_rows)} rows, stdout {len(rows)}")
    csv_keys = {(c["shape"], c["path"], c["dtype"], int(c["threads"])): c for c in csv_rows}
    if set(csv_keys) != expected:
        fail("CSV rows differ from stdout rows")

    warnings = 0
    not_run = {}
    n_serving = 0
    for row in rows:
        where = f"{row['shape']} {row['path']} {row['dtype']} threads={row['thr']}"
        c = csv_keys[(row["shape"], row["path"], row["dtype"], row["thr"])]
        if c["status"] != row["status"] or c["kernel"] != row["kernel"]:
            fail(f"{where}: CSV and stdout disagree")
        want_dt = {"f32": ("f32", "f32", "f32"), "f16kv": ("f32", "f16", "f32"), "bf16kv": ("f32", "bf16", "f32"),
                   "bf16": ("bf16", "bf16", "bf16"), "bf16r": ("bf16", "bf16", "bf16"),
                   "bf16amx": ("bf16", "bf16", "bf16")}[row["dtype"]]
        if (c["q_dtype"], c["kv_dtype"], c["out_dtype"]) != want_dt:
            fail(f"{where}: CSV dtypes {c['q_dtype']}/{c['kv_dtype']}/{c['out_dtype']}, want {want_dt}")
        if row["status"] not in ("ok", "unsupported"):
            fail(f"{where}: status {row['status']} ({row['note']})")
        if row["shape"].split("-", 1)[0] in SERVING:
            n_serving += check_serving_row(row, c, where, not_run)
            continue
        if row["dtype"] == "f32" and row["path"] in ("reference",) + PREV + ("prev-0.3:decode",) \
                and row["status"] != "ok":
            fail(f"{where}: this path must run")
        if row["dtype"] == "bf16amx" and row["path"] in LIBRARY and row["path"] != "reference":
            # after sdpa_request_amx(): not run where the CPU or Linux says no, else the AMX kernel
            # wherever the head sizes fit it (E a multiple of 32), on the tiled path
            if row["status"] == "unsupported":
                if "AMX_unavailable" not in row["note"] or not row["note"].startswith("not_run:"):
                    fail(f"{where}: a bf16amx row not run must say why ({row['note']})")
                not_run["bf16amx"] = not_run.get("bf16amx", 0) + 1
                continue
            if int(c["E"]) % 32 == 0 and row["path"] in ("tiled", "auto") and "amx" not in row["kernel"]:
                fail(f"{where}: AMX was granted but the kernel is {row['kernel']}")
        if row["status"] == "unsupported":
            if row["path"].startswith("fma-") or (row["dtype"] != "f32" and "SDPA_ERR_DTYPE" in row["note"]):
                if not row["note"].startswith("not_run:"):
                    fail(f"{where}: an unsupported dtype/ISA row must say not_run ({row['note']})")
                kind = "fma" if row["path"].startswith("fma-") else row["dtype"]
                not_run[kind] = not_run.get(kind, 0) + 1
            continue
        if row["path"].startswith("fma-"):
            if row["GF/s"] is None or not row["GF/s"] > 0:
                fail(f"{where}: no GF/s")
            continue
        if row["reps"] < 2 or row["median_ms"] is None or row["median_ms"] < 0:
            fail(f"{where}: no timing")
        if row["path"] == "bw-floor":
            if row["GB/s"] is None:
                fail(f"{where}: no GB/s")
            continue
        # A tiny smoke shape under a sanitizer can print 0.00 GF/s: only the column must be there.
        if row["GF/s"] is None or row["GF/s"] < 0:
            fail(f"{where}: no GFLOP/s")
        if row["path"] not in LIBRARY:
            continue
        if row["kernel"] in ("-", "?"):
            fail(f"{where}: no kernel name")
        tol = TOL if row["dtype"] == "f32" else min(float(c["tol"]), TOL_REDUCED_MAX)
        for k in ("diff_ref", "diff_naive"):
            if k == "diff_ref" and row[k] is None and row["dtype"] != "f32":
                continue  # no reference output for this dtype (the reference path does not serve it)
            if row[k] is None or not row[k] <= tol:
                fail(f"{where}: {k} = {row[k]} exceeds {tol}")
        base = row["path"].split(":")[-1]
        if base in ("tiled", "decode") and not row["kernel"].startswith(base):
            print(f"WARNING: {where}: forced {row['path']} reported kernel '{row['kernel']}'")
            warnings += 1
    for kind, n in sorted(not_run.items()):
        what = "FMA loops this CPU/build lacks" if kind == "fma" else \
            "bf16amx rows (no AMX: CPU, Linux or build)" if kind == "bf16amx" else \
            f"{kind} rows the library answers with SDPA_ERR_DTYPE"
        print(f"bench_smoke: not run: {n} row(s): {what}")
    if not baseline:
        print("bench_smoke: not run: prev-0.3 candidates (no baseline configured: meson -Dbench_baseline=PATH)")
    if n_serving == 0:
        fail("no serving (issue 10) rows were checked")
    print(f"bench_smoke: {len(rows)} rows checked ({n_serving} serving rows), {sum(not_run.values())} not run, "
          f"{warnings} warning(s)")


if __name__ == "__main__":
    main()
