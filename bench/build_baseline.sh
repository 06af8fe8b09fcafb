#!/bin/sh
# Build the previous release of libsdpa (default: 0.3 = commit 26b3d60) as a stand-alone
# shared library for sdpa-bench's prev-0.3 candidates, and print the path of the .so.
#
#   bench/build_baseline.sh [COMMIT [OUT_DIR]]     (defaults: 26b3d60, /tmp/libsdpa-baseline-COMMIT)
#
# The sources come from `git archive` of that commit of this repository (no worktree, nothing
# in the caller's tree changes); meson release build of the library target only (-j2).
# Reuses an earlier build in OUT_DIR. The last line of stdout is the library's path.
set -eu
commit=${1:-26b3d60}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
if ! full=$(git -C "$repo" rev-parse --verify -q "$commit^{commit}"); then
    echo "build_baseline.sh: commit $commit is not in $repo (a shallow clone? git fetch --unshallow)" >&2
    exit 1
fi
out=${2:-/tmp/libsdpa-baseline-$commit}
src=$out/src
bld=$out/build
if [ ! -f "$src/meson.build" ]; then
    rm -rf "$src"
    mkdir -p "$src"
    git -C "$repo" archive --format=tar "$full" | tar -x -C "$src"
fi
version=$(sed -n "s/^  version: '\([0-9.]*\)',$/\1/p" "$src/meson.build" | head -n 1)
if [ -z "$version" ]; then
    echo "build_baseline.sh: cannot read the version from $src/meson.build" >&2
    exit 1
fi
if [ ! -f "$bld/build.ninja" ]; then
    meson setup "$bld" "$src" --buildtype=release -Dtests=false >&2
fi
ninja -C "$bld" -j2 "libsdpa.so.$version" >&2
lib=$bld/libsdpa.so.$version
test -f "$lib"
echo "$lib"
