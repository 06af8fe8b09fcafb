#!/usr/bin/env python3
"""Keep the code in README.md and docs/*.md runnable (registered as the meson test docs_examples).

    check_docs.py --source-root . --build-root build --cc cc --lib build/libsdpa.so
    check_docs.py --source-root . --run docs/building.md ...   # run the pages' ```sh blocks

Default (the test):
  ```c       compiled with -std=c11 -Wall -Wextra -Werror against include/ and the library just
             built, and run from the source root; it must exit 0. Every C block is a whole
             program (README's first one is examples/readme_usage.c, checked by readme_sync).
  ```python  run with this Python (PYTHONPATH=python, SDPA_LIBRARY = the library); exit 0.
  ```sh      `bash -n` (syntax), and every repository path it names (examples/..., tests/...,
             bench/..., python/..., docs/..., include/..., .ci/...) must exist, and every
             `--suite NAME` must be a suite some meson.build registers. These blocks install
             packages and build trees, so the test does not run them.
  README.md's performance table and docs/performance.md's current table are the same.
--run PAGE...: runs every ```sh block of the pages, in order, each with `bash -euo pipefail`,
  from the source root (use a scratch clone: they build, install and write files), and stops
  at the first failure.
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
REPO_DIRS = ("examples/", "tests/", "bench/", "python/", "docs/", "include/", "src/", ".ci/", "cmake/")


def pages(root):
    return [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))


def blocks(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        yield m.group(1), m.group(2), line


def meson_suites(root):
    suites = set()
    for mb in glob.glob(os.path.join(root, "**", "meson.build"), recursive=True):
        if os.path.relpath(mb, root).startswith("build"):
            continue
        with open(mb, encoding="utf-8") as f:
            for arg in re.findall(r"suite\s*:\s*(\[[^\]]*\]|'[^']*')", f.read()):
                suites.update(re.findall(r"'([^']+)'", arg))
    return suites


def check_c(code, where, args, tmp):
    if "int main(" not in code:
        return f"{where}: a ```c block must be a whole program (int main)"
    src = os.path.join(tmp, "block.c")
    exe = os.path.join(tmp, "block")
    with open(src, "w", encoding="utf-8") as f:
        f.write(code)
    libdir = os.path.dirname(args.lib)
    cmd = [args.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I",
           os.path.join(args.source_root, "include"), src, args.lib, "-lm",
           "-Wl,-rpath," + libdir, "-o", exe]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return f"{where}: does not compile:\n{r.stderr}"
    # A cross build (cross/aarch64.txt) runs the block's program under meson's exe wrapper (qemu).
    wrapper = shlex.split(os.environ.get("MESON_EXE_WRAPPER", ""))
    r = subprocess.run(wrapper + [exe], capture_output=True, text=True, cwd=args.source_root, timeout=120)
    if r.returncode != 0:
        return f"{where}: exits {r.returncode}:\n{r.stdout}{r.stderr}"
    return None


def check_python(code, where, args):
    env = dict(os.environ, PYTHONPATH=os.path.join(args.source_root, "python"),
               SDPA_LIBRARY=args.lib, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=args.source_root, env=env, timeout=120)
    if r.returncode != 0:
        return f"{where}: exits {r.returncode}:\n{r.stdout}{r.stderr}"
    return None


def check_sh(code, where, args, suites):
    r = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True)
    if r.returncode != 0:
        return f"{where}: bash -n: {r.stderr}"
    errors = []
    for line in code.splitlines():
        line = line.split(" #", 1)[0]
        try:
            words = shlex.split(line)
        except ValueError as e:
            errors.append(f"{where}: {line!r}: {e}")
            continue
        for i, w in enumerate(words):
            for token in re.split(r"[=:]", w):
                token = token.rstrip(";&|)")
                if token.startswith(REPO_DIRS) and not any(c in token for c in "*$<>"):
                    if not os.path.exists(os.path.join(args.source_root, token)):
                        errors.append(f"{where}: names {token}, which does not exist")
            if w == "--suite" and i + 1 < len(words) and words[i + 1] not in suites:
                errors.append(f"{where}: --suite {words[i + 1]}: no meson.build registers that suite")
    return "\n".join(errors) or None


def current_table(path):
    """The README's one performance table: the table whose header starts '| target (issue) |'."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, l in enumerate(lines):
        if l.startswith("| target (issue) |"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            return lines[i:j]
    return None


def same_current_table(root):
    readme = current_table(os.path.join(root, "README.md"))
    perf = current_table(os.path.join(root, "docs", "performance.md"))
    if readme is None or perf is None:
        return ["README.md and docs/performance.md must both show the current table ('| target (issue) |')"]
    if readme != perf:
        return ["README.md's performance table differs from docs/performance.md's; copy one onto the other"]
    return []


def run_sh(paths, root):
    for path in paths:
        for lang, code, line in blocks(path):
            if lang != "sh":
                continue
            where = f"{os.path.relpath(path, root)}:{line}"
            print(f"==== {where}\n{code}", flush=True)
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=root)
            if r.returncode != 0:
                print(f"FAILED ({r.returncode}): {where}")
                return 1
    print("all ```sh blocks ran")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-root", required=True)
    ap.add_argument("--build-root")
    ap.add_argument("--cc", default="cc")
    ap.add_argument("--lib")
    ap.add_argument("--run", nargs="+", metavar="PAGE")
    args = ap.parse_args()
    root = os.path.abspath(args.source_root)
    args.source_root = root
    if args.lib:
        args.lib = os.path.abspath(args.lib)  # meson may pass it relative to the build directory
    if args.run:
        return run_sh([os.path.abspath(p) for p in args.run], root)
    suites = meson_suites(root)
    failures, counts = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in pages(root):
            first_c = os.path.basename(path) == "README.md"
            for lang, code, line in blocks(path):
                where = f"{os.path.relpath(path, root)}:{line}"
                if lang == "c" and first_c:
                    first_c = False  # examples/readme_usage.c (readme_sync)
                    counts["c (readme_sync)"] = counts.get("c (readme_sync)", 0) + 1
                    continue
                if lang == "c":
                    err = check_c(code, where, args, tmp)
                elif lang == "python" and os.environ.get("MESON_EXE_WRAPPER"):
                    # a cross build: this machine's Python cannot load the library built for the
                    # other one; the block is counted as not run (the native build runs it)
                    counts["python (not run: cross build)"] = counts.get("python (not run: cross build)", 0) + 1
                    continue
                elif lang == "python":
                    err = check_python(code, where, args)
                elif lang == "sh":
                    err = check_sh(code, where, args, suites)
                else:
                    continue
                counts[lang] = counts.get(lang, 0) + 1
                if err:
                    failures.append(err)
    failures += same_current_table(root)
    for f in failures:
        print("FAIL " + f)
    print(f"{len(pages(root))} pages; blocks checked: " +
          ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) +
          f"; {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
