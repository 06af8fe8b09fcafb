#!/usr/bin/env python3
"""ABI checks for libsdpa.so (DESIGN.md section 8).

1. The exported dynamic symbols equal tests/abi/symbols.txt exactly, and equal the
   SDPA_API declarations of include/sdpa.h and the global list of src/sdpa.map.
2. abidiff against the recorded baseline tests/abi/libsdpa.abi (libabigail) reports no
   change to the exported ABI (functions, their types, struct layouts).

Usage: check_abi.py LIB SOURCE_ROOT [--update]   (--update rewrites the baseline files)
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ("T", "W", "D", "B", "R"):
            names.add(parts[2].split("@")[0])
    return names


def main():
    lib, root = sys.argv[1], Path(sys.argv[2])
    update = "--update" in sys.argv
    here = root / "tests" / "abi"
    header = (root / "include" / "sdpa.h").read_text()
    declared = set(re.findall(r"^SDPA_API[^(]*?\b(sdpa_\w+)\(", header, re.M))
    mapped = set(re.findall(r"^\s+(sdpa_\w+);", (root / "src" / "sdpa.map").read_text(), re.M))
    have = exported(lib)
    failures = []
    if update:
        (here / "symbols.txt").write_text("".join(s + "\n" for s in sorted(have)))
    listed = set((here / "symbols.txt").read_text().split())
    for name, other in (("include/sdpa.h SDPA_API", declared), ("src/sdpa.map", mapped), ("tests/abi/symbols.txt", listed)):
        if other != have:
            failures.append(f"exports differ from {name}: only exported {sorted(have - other)}, "
                            f"only in {name} {sorted(other - have)}")
    abidw = shutil.which("abidw")
    abidiff = shutil.which("abidiff")
    checks = 2
    with open(lib, "rb") as f:
        machine = int.from_bytes(f.read(20)[18:20], "little")  # ELF e_machine
    if machine != 62 and not update:
        # The baseline is the x86-64 library's (EM_X86_64 = 62): abidiff against another
        # architecture's library (a cross build, cross/aarch64.txt) reports the architecture
        # change itself. The export lists above are checked on every architecture.
        print(f"abi: abidiff not run: tests/abi/libsdpa.abi is x86-64's, this library's ELF machine is {machine}")
        checks = 1
    elif abidw is None or abidiff is None:
        failures.append("abidw/abidiff not found: install abigail-tools (the ABI baseline check must run)")
    else:
        baseline = here / "libsdpa.abi"
        if update:
            subprocess.run([abidw, "--no-corpus-path", "--headers-dir", str(root / "include"), "--out-file",
                            str(baseline), lib], check=True)
        r = subprocess.run([abidiff, "--headers-dir2", str(root / "include"), "--no-added-syms", str(baseline), lib],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append("abidiff against tests/abi/libsdpa.abi reports an ABI change "
                            f"(exit {r.returncode}):\n{r.stdout}{r.stderr}")
    failed = len(failures)
    for f in failures:
        print("FAIL:", f)
    print(f"abi: {len(have)} exported symbols checked")
    print(f"{checks - min(failed, checks)} passed, {min(failed, checks)} failed" + (", 1 skipped" if checks == 1 else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
