#!/usr/bin/env bash
# Install libsdpa from the source tree into a temporary prefix, then configure, build and run
# tests/cmake_consumer against it with CMake (shared and static targets). Usage, from the
# repository root:  bash tests/cmake_consumer/run.sh [WORKDIR]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$(mktemp -d)}
prefix="$work/prefix"
meson setup "$work/build" "$src" --prefix="$prefix" --buildtype=release -Dtests=false >/dev/null
ninja -C "$work/build" -j2 >/dev/null
meson install -C "$work/build" >/dev/null
config=$(find "$prefix" -name sdpaConfig.cmake)
echo "installed: $config"
cmake -S "$src/tests/cmake_consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
cmake --build "$work/consumer" -j2
"$work/consumer/consumer_shared"
"$work/consumer/consumer_static"
# The static program must not need libsdpa.so at run time.
if ldd "$work/consumer/consumer_static" | grep -q 'libsdpa\.so'; then
  echo "consumer_static links libsdpa.so dynamically" >&2
  exit 1
fi
echo "cmake consumer: OK"
