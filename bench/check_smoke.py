#!/usr/bin/env python3
"""The bench_smoke test: run `sdpa-bench --smoke --csv FILE` and check what it printed.

- the program exits 0 (it exits 1 itself when a library path fails or disagrees with the
  reference path beyond its tolerance);
- every stdout row has the 17 columns of the header, numbers where numbers belong;
- one row per (shape, path, threads) that the bench promises: blas-floor, reference, tiled,
  auto for every shape, bw-floor and decode for L <= 4, at threads 1 and 2;
- the CSV holds the same rows; status is ok or unsupported (reference: ok);
- every ok library row agrees with the reference path and with the double-precision check
  (max abs diff <= 1e-4), and its kernel name is set.
A forced kernel whose reported name does not start with the path's name is printed as a
warning (the row shows which kernel really ran).

Usage: check_smoke.py path/to/sdpa-bench
"""
import csv
import os
import subprocess
import sys
import tempfile

TOL = 1e-4
THREADS = (1, 2)
COLUMNS = ["shape", "path", "thr", "status", "kernel", "reps", "median_ms", "min_ms", "GF/s", "GF/s_eff",
           "GB/s", "cores", "ws_MiB", "rss_MiB", "diff_ref", "diff_naive", "note"]
NUMERIC = ["median_ms", "min_ms", "GF/s", "GF/s_eff", "GB/s", "cores", "ws_MiB", "rss_MiB", "diff_ref", "diff_naive"]
LIBRARY = ("reference", "tiled", "decode", "auto")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def num(s):
    return None if s == "-" else float(s)


def main():
    if len(sys.argv) != 2:
        fail("usage: check_smoke.py path/to/sdpa-bench")
    exe = sys.argv[1]
    names = subprocess.run([exe, "--smoke", "--list"], capture_output=True, text=True, check=True).stdout.split()
    if not names:
        fail("--smoke --list printed no shape")
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = os.path.join(tmp, "smoke.csv")
        r = subprocess.run([exe, "--smoke", "--csv", csv_path], capture_output=True, text=True, timeout=100)
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
    for name in names:
        L = int(name.split("-", 1)[1].split("x")[2])
        paths = ["blas-floor", "reference", "tiled", "auto"] + (["bw-floor", "decode"] if L <= 4 else [])
        expected |= {(name, p, t) for p in paths for t in THREADS}
    got = [(r["shape"], r["path"], r["thr"]) for r in rows]
    if len(got) != len(set(got)):
        fail("duplicate (shape, path, threads) rows")
    if set(got) != expected:
        fail(f"rows differ from the expected set: missing {sorted(expected - set(got))}, "
             f"extra {sorted(set(got) - expected)}")
    if len(csv_rows) != len(rows):
        fail(f"CSV has {len(csv_rows)} rows, stdout {len(rows)}")
    csv_keys = {(c["shape"], c["path"], int(c["threads"])): c for c in csv_rows}
    if set(csv_keys) != expected:
        fail("CSV rows differ from stdout rows")

    warnings = 0
    for row in rows:
        where = f"{row['shape']} {row['path']} threads={row['thr']}"
        c = csv_keys[(row["shape"], row["path"], row["thr"])]
        if c["status"] != row["status"] or c["kernel"] != row["kernel"]:
            fail(f"{where}: CSV and stdout disagree")
        if row["status"] not in ("ok", "unsupported"):
            fail(f"{where}: status {row['status']} ({row['note']})")
        if row["path"] == "reference" and row["status"] != "ok":
            fail(f"{where}: the reference path must run")
        if row["status"] != "ok":
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
        for k in ("diff_ref", "diff_naive"):
            if row[k] is None or not row[k] <= TOL:
                fail(f"{where}: {k} = {row[k]} exceeds {TOL}")
        if row["path"] in ("tiled", "decode") and not row["kernel"].startswith(row["path"]):
            print(f"WARNING: {where}: forced {row['path']} reported kernel '{row['kernel']}'")
            warnings += 1
    print(f"bench_smoke: {len(rows)} rows checked, {warnings} warning(s)")


if __name__ == "__main__":
    main()
