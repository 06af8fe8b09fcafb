#!/usr/bin/env python3
"""Instructions in the innermost loops of one function of an `objdump -d` listing (x86-64 or
aarch64): each backward branch whose target lies in the function closes a loop; a loop that
contains no other is printed with its address range and instruction count (and, with -v, its
instructions). docs/performance.md ("ARM64") counts the decode loops this way:

    aarch64-linux-gnu-objdump -d --no-show-raw-insn build-aarch64/libsdpa_neon.a.p/src_microkernel_neon.c.o > neon.txt
    python3 bench/loop_insns.py neon.txt n_dot_rows_f32
    objdump -d --no-show-raw-insn build/libsdpa_avx512.a.p/src_microkernel_avx512.c.o > avx512.txt
    python3 bench/loop_insns.py avx512.txt z_dot_rows_f32 -v
"""
import re
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    listing, func, verbose = sys.argv[1], sys.argv[2], "-v" in sys.argv[3:]
    ins, on = [], False
    with open(listing) as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+) <(.+)>:$", line.rstrip("\n"))
            if m:
                on = m.group(2) == func
                continue
            m = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", line.rstrip("\n")) if on else None
            if m:
                ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if not ins:
        sys.exit(f"{func}: not in {listing} (objdump -d --no-show-raw-insn)")
    addr = [a for a, _, _ in ins]
    loops = []
    for i, (a, op, args) in enumerate(ins):
        # branches: x86 j*, aarch64 b / b.cond / cbz / cbnz / tbz / tbnz (not bl, bic, bsl, ...)
        if not (op.startswith("j") or op == "b" or op.startswith("b.") or op in ("cbz", "cbnz", "tbz", "tbnz")):
            continue
        m = re.search(r"\b([0-9a-f]+) <", args)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in addr:
            j = addr.index(int(m.group(1), 16))
            loops.append((j, i))
    for j, i in sorted(loops):
        if any(j2 >= j and i2 <= i and (j2, i2) != (j, i) for j2, i2 in loops):
            continue  # contains another loop
        print(f"{func}: innermost loop {ins[j][0]:x}..{ins[i][0]:x}: {i - j + 1} instructions")
        if verbose:
            for a, op, args in ins[j:i + 1]:
                print(f"    {a:x}: {op} {args}")


if __name__ == "__main__":
    main()
