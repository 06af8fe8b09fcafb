#!/usr/bin/python3
"""Mutation driver for libsdpa.

Each mutant in mutants.txt is one (file, exact original snippet, replacement) plausible bug.
For every mutant the driver applies it to a private copy of the tree (the snippet must occur
exactly once), rebuilds, runs tests and records whether some test failed (the mutant is
"killed") or all passed (it "survived"). Copies are made once per worker (-j) from the files
git tracks in the working tree, configured once, and restored after each mutant, so a mutant
costs one incremental rebuild plus the tests.

    /usr/bin/python3 tests/mutation/run_mutants.py [-j 2] [--only ID,ID] [--suites unit,robustness]
        [--exclude test_rlimit_reference] [--fast] [--record] [--stale-only] [--list]

Modes:
  (default)     every non-equivalent mutant against the whole of the given suites (the full
                score; about an hour on 2 vCPUs).
  --fast        every non-equivalent mutant against the tests its `killed-by:` line names,
                building only those tests' executables (CI runs this: a mutant that the test
                recorded as its killer no longer kills has survived). A mutant without a
                `killed-by:` line runs the whole suites, as in the default mode.
  --record      after a default run, write each killed mutant's failing tests into mutants.txt
                as its `killed-by:` line (the tests --fast will run).
  --stale-only  only check that every mutant's original snippet (equivalent ones too) occurs
                exactly once in its file; seconds.

A mutant on a path the CPU may lack names it (`needs: amx`): where the CPU lacks it the mutant
is reported as not run (its tests skip), counted apart, and does not fail the run.

A mutant block:  ## ID: description / [equivalent: reason] / [needs: feature] / [killed-by: test, test] / @@ file /
<<< / original / === / replacement / >>>. Exit status 0 when no mutant is stale and every
non-equivalent one is killed, 1 otherwise.
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MUTANTS = os.path.join(HERE, "mutants.txt")


def parse(path):
    """Blocks:  ## ID: description / @@ file / <<< / original / === / replacement / >>>"""
    mutants, cur, mode = [], None, None
    for line in open(path, encoding="utf-8").read().split("\n"):
        if mode in ("orig", "repl"):
            if line == "===" and mode == "orig":
                mode = "repl"
                continue
            if line == ">>>" and mode == "repl":
                cur["orig"] = "\n".join(cur["orig"])
                cur["repl"] = "\n".join(cur["repl"])
                mutants.append(cur)
                cur, mode = None, None
                continue
            cur[mode].append(line)
            continue
        if line.startswith("## "):
            ident, _, desc = line[3:].partition(":")
            cur = {"id": ident.strip(), "desc": desc.strip(), "file": None, "orig": [], "repl": [],
                   "equivalent": None, "killed_by": [], "needs": []}
        elif line.startswith("@@ ") and cur is not None:
            cur["file"] = line[3:].strip()
        elif line.startswith("equivalent:") and cur is not None:
            cur["equivalent"] = line.split(":", 1)[1].strip()
        elif line.startswith("needs:") and cur is not None:
            cur["needs"] = [t.strip() for t in line.split(":", 1)[1].split(",") if t.strip()]
        elif line.startswith("killed-by:") and cur is not None:
            cur["killed_by"] = [t.strip() for t in line.split(":", 1)[1].split(",") if t.strip()]
        elif line == "<<<" and cur is not None:
            mode = "orig"
        elif line.strip() and not line.startswith("#"):
            raise SystemExit(f"{path}: cannot parse line: {line!r}")
    return mutants


def stale_reason(m, root=ROOT):
    path = os.path.join(root, m["file"])
    if not os.path.isfile(path):
        return f"{m['file']} does not exist"
    n = open(path, encoding="utf-8").read().count(m["orig"])
    return None if n == 1 else f"original snippet found {n} times in {m['file']}"


# CPU features a mutant's code path needs (`needs:`), as /proc/cpuinfo names them.
FEATURE_FLAGS = {"amx": ["amx_tile", "amx_bf16"], "avx512": ["avx512f"], "avx512bf16": ["avx512_bf16"],
                 "avx2": ["avx2", "fma"]}


def cpu_lacks(needs):
    """The features of `needs` this CPU lacks (a mutant on such a path cannot be run here)."""
    try:
        flags = set()
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("flags"):
                flags |= set(line.split(":", 1)[1].split())
    except OSError:
        flags = set()
    return [n for n in needs if not all(f in flags for f in FEATURE_FLAGS.get(n, [n]))]


def copy_tree(dst):
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], check=True, capture_output=True).stdout
    for f in files.decode().split("\0"):
        if not f:
            continue
        src = os.path.join(ROOT, f)
        if not os.path.isfile(src):
            continue
        d = os.path.join(dst, f)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copy2(src, d)


def run(cmd, cwd, timeout):
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return -1, "timeout"


FAILED_LINE = re.compile(r"^\s*\d+/\d+\s+\S+\s+/\s+(\S+)\s+(FAIL|TIMEOUT|ERROR)\b")


class Worker:
    def __init__(self, idx, suites, exclude, fast):
        self.dir = tempfile.mkdtemp(prefix=f"sdpa-mut{idx}-")
        self.suites = suites
        self.exclude = exclude
        self.names = None
        copy_tree(self.dir)
        rc, out = run(["meson", "setup", "build", "-Dwerror=false"], self.dir, 600)
        if rc != 0:
            raise SystemExit(f"meson setup failed in {self.dir}:\n{out[-3000:]}")
        rc, out = run(["ninja", "-C", "build", "-j1"], self.dir, 1800)
        if rc != 0:
            raise SystemExit(f"baseline build failed:\n{out[-3000:]}")
        rc, out = run(["meson", "introspect", "--tests", "build"], self.dir, 120)
        # test name -> ninja target of its executable (relative to build/)
        self.targets = {}
        for t in json.loads(out) if rc == 0 else []:
            exe = t["cmd"][0]
            build = os.path.join(self.dir, "build") + os.sep
            self.targets[t["name"]] = exe[len(build):] if exe.startswith(build) else None
        if not fast:  # the baseline must pass what the mutants will run
            rc, out = self.test_suites()
            if rc != 0:
                raise SystemExit(f"baseline suites fail (fix them first):\n{out[-3000:]}")

    def suite_names(self):
        if self.names is None:
            rc, out = run(["meson", "test", "-C", "build", "--no-rebuild", "--list"], self.dir, 120)
            self.names = []
            for line in out.splitlines():  # "libsdpa:suite / name"
                if " / " not in line:
                    continue
                suite, name = line.split(" / ", 1)
                if any(suite.endswith(":" + s) or (":" + s + "+") in suite or suite.endswith("+" + s)
                       for s in self.suites) and name.strip() not in self.exclude:
                    self.names.append(name.strip())
        return self.names

    def test_suites(self):
        cmd = ["meson", "test", "-C", "build", "--no-rebuild", "--num-processes", "2", "--maxfail", "1"]
        return run(cmd + self.suite_names(), self.dir, 900)

    def try_mutant(self, m, fast):
        path = os.path.join(self.dir, m["file"])
        text = open(path, encoding="utf-8").read()
        n = text.count(m["orig"])
        if n != 1:
            return "stale", f"original snippet found {n} times in {m['file']}", []
        open(path, "w", encoding="utf-8").write(text.replace(m["orig"], m["repl"]))
        try:
            names = m["killed_by"] if fast and m["killed_by"] else None
            if names:
                unknown = [t for t in names if t not in self.targets]
                if unknown:
                    return "stale", f"killed-by names unknown tests: {', '.join(unknown)}", []
                # the tests' own executables (their dependencies, the library first, come along);
                # a test run through an interpreter (Python) needs the whole build
                targets = [] if any(self.targets[t] is None for t in names) else sorted({self.targets[t] for t in names})
                rc, out = run(["ninja", "-C", "build", "-j1"] + targets, self.dir, 1800)
            else:
                rc, out = run(["ninja", "-C", "build", "-j1"], self.dir, 1800)
            if rc != 0:
                return "killed", "does not compile", []
            if names:
                rc, out = run(["meson", "test", "-C", "build", "--no-rebuild", "--num-processes", "2"] + names,
                              self.dir, 900)
            else:
                rc, out = self.test_suites()
            if rc != 0:
                failed = [mm.group(1) for mm in map(FAILED_LINE.match, out.splitlines()) if mm]
                return "killed", "; ".join(failed)[:200] or "suite failed", failed
            return "survived", ("by " + ", ".join(names)) if names else "", []
        finally:
            open(path, "w", encoding="utf-8").write(text)
            os.utime(path)


def record(results):
    """Write `killed-by:` lines (the failing tests of this run) into mutants.txt."""
    lines = open(MUTANTS, encoding="utf-8").read().split("\n")
    out, cur = [], None
    for line in lines:
        if line.startswith("## "):
            cur = line[3:].partition(":")[0].strip()
        if line.startswith("killed-by:") and cur in results:
            continue  # replaced below
        if line.startswith("@@ ") and cur in results:
            out.append("killed-by: " + ", ".join(results[cur]))
        out.append(line)
    open(MUTANTS, "w", encoding="utf-8").write("\n".join(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-j", type=int, default=1, help="parallel workers (each has its own tree copy)")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--suites", default="unit", help="comma-separated meson suites to run per mutant")
    ap.add_argument("--exclude", default="test_rlimit_reference",
                    help="comma-separated test names left out (test_rlimit_reference hangs until the reference "
                         "kernel no longer calls BLAS)")
    ap.add_argument("--fast", action="store_true", help="run each mutant's killed-by tests only")
    ap.add_argument("--record", action="store_true", help="write killed-by lines for the killed mutants")
    ap.add_argument("--stale-only", action="store_true", help="only check the snippets (all mutants)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the worker directories")
    args = ap.parse_args()
    mutants = parse(MUTANTS)
    ids = [m["id"] for m in mutants]
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        raise SystemExit(f"mutants.txt: duplicate ids {dups}")
    if args.only:
        want = set(args.only.split(","))
        mutants = [m for m in mutants if m["id"] in want]
    if args.list:
        for m in mutants:
            print(f"{m['id']:6} {m['file']:28} {m['desc']}")
        return 0
    # Stale check of every selected mutant, equivalent ones included: a catalogue entry whose
    # code moved no longer says anything.
    stale = {m["id"]: r for m in mutants for r in [stale_reason(m)] if r}
    for i, r in stale.items():
        print(f"{'stale':9} {i:6} {r}", flush=True)
    if args.stale_only:
        print(f"stale check: {len(mutants)} mutants, {len(stale)} stale")
        return 1 if stale else 0
    # A mutant on a path this CPU lacks (AMX, ...) is reported as not run, never as killed or
    # survived: the tests of that path skip here.
    not_run = {m["id"]: cpu_lacks(m["needs"]) for m in mutants if not m["equivalent"] and cpu_lacks(m["needs"])}
    for m in mutants:
        if m["id"] in not_run and m["id"] not in stale:
            print(f"{'not run':9} {m['id']:6} {m['desc']}  [this CPU lacks {', '.join(not_run[m['id']])}]", flush=True)
    todo = [m for m in mutants if not m["equivalent"] and m["id"] not in stale and m["id"] not in not_run]
    suites = args.suites.split(",")
    t0 = time.time()
    print(f"{len(mutants)} mutants ({sum(1 for m in mutants if m['equivalent'])} marked equivalent, {len(stale)} stale), "
          f"suites {suites}, -j {args.j}{', fast (killed-by tests)' if args.fast else ''}", flush=True)
    workers = [Worker(i, suites, set(args.exclude.split(",")), args.fast) for i in range(max(1, args.j))]
    free = list(workers)
    results, killers = {}, {}

    def job(m):
        w = free.pop()
        try:
            return m, w.try_mutant(m, args.fast)
        finally:
            free.append(w)

    with cf.ThreadPoolExecutor(max_workers=len(workers)) as ex:
        for m, (verdict, why, failed) in ex.map(job, todo):
            results[m["id"]] = verdict
            if verdict == "killed" and failed:
                killers[m["id"]] = failed
            print(f"{verdict:9} {m['id']:6} {m['desc']}" + (f"  [{why}]" if why else ""), flush=True)
    killed = sum(v == "killed" for v in results.values())
    survived = sorted(i for i, v in results.items() if v == "survived")
    nstale = len(stale) + sum(v == "stale" for v in results.values())
    print(f"mutation score: {killed}/{len(results)} killed, {len(survived)} survived"
          f"{' (' + ', '.join(survived) + ')' if survived else ''}, {nstale} stale, "
          f"{sum(1 for m in mutants if m['equivalent'])} equivalent excluded, "
          f"{len(not_run)} not run (a path this CPU lacks), {time.time() - t0:.0f} s")
    if args.record and killers:
        record(killers)
        print(f"recorded killed-by for {len(killers)} mutants in {MUTANTS}")
    if not args.keep:
        for w in workers:
            shutil.rmtree(w.dir, ignore_errors=True)
    return 0 if not survived and nstale == 0 and killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
