#!/bin/sh
# Bit-identity check (issue 28): run the bitid harness once per ISA cap (SDPA_MAX_ISA, one
# process each) and compare its hashes with those recorded in expected.txt (e9b0d46, the tree
# before the 0.6 core refactor, on an AVX-512 + AVX512-BF16 CPU). expected-0.5.0.txt holds
# 0.5.0's (9892fff): it differs only in the groups that the documented changes after 0.5.0 move
# (CHANGELOG "Unreleased": bf16 REDUCED P.V by VDPBF16PS, paged bf16 REDUCED on the bf16
# kernels, packed dropout per sequence, decode's key split; bisected to the bf16pf merge 85c382c
# for dense/tiled/bf16/reduced). A cap whose probe line (the tiled kernel's name under that cap)
# differs from the recorded one is another CPU: skipped, not failed.
#
#   tests/bitid/check.sh BITID_EXE [EXPECTED]          compare (exit 1 on a difference)
#   tests/bitid/check.sh --record BITID_EXE > FILE     print the hashes of this build
# The recorded hashes are x86-64's: a build for another architecture (SDPA_BITID_HOST, from
# meson: host_machine.cpu_family()) is not compared (exit 77, not run). A cross build's harness
# runs under meson's exe wrapper (MESON_EXE_WRAPPER, qemu), e.g. for --record.
set -u
record=0
if [ "${1:-}" = "--record" ]; then record=1; shift; fi
exe=$1
expected=${2:-$(dirname "$0")/expected.txt}
host=${SDPA_BITID_HOST:-x86_64}
if [ $record = 0 ] && [ "$host" != x86_64 ]; then
    echo "bitid: not run: $expected holds x86-64 hashes; this build is for $host (other instructions, other bits)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
compared=0
for cap in portable avx2 avx512 best; do
    if [ "$cap" = best ]; then
        env -u SDPA_MAX_ISA ${MESON_EXE_WRAPPER:-} "$exe" > "$tmp/$cap.txt" || { echo "bitid failed under $cap"; exit 1; }
    else
        SDPA_MAX_ISA=$cap ${MESON_EXE_WRAPPER:-} "$exe" > "$tmp/$cap.txt" || { echo "bitid failed under $cap"; exit 1; }
    fi
    if [ $record = 1 ]; then
        echo "== $cap"
        cat "$tmp/$cap.txt"
        continue
    fi
    sed -n "/^== $cap\$/,/^== /p" "$expected" | grep -v '^== ' > "$tmp/$cap.want"
    if [ "$(head -n 1 "$tmp/$cap.want")" != "$(head -n 1 "$tmp/$cap.txt")" ]; then
        echo "$cap: probe '$(head -n 1 "$tmp/$cap.txt")' differs from the recorded '$(head -n 1 "$tmp/$cap.want")': another CPU, skipped"
        continue
    fi
    compared=$((compared + 1))
    if diff -u "$tmp/$cap.want" "$tmp/$cap.txt" > "$tmp/$cap.diff"; then
        echo "$cap: $(wc -l < "$tmp/$cap.txt") lines identical"
    else
        echo "$cap: DIFFERENT"
        cat "$tmp/$cap.diff"
        status=1
    fi
done
[ $record = 1 ] && exit 0
if [ $compared = 0 ]; then
    echo "no cap comparable on this CPU"
    exit 77
fi
exit $status
