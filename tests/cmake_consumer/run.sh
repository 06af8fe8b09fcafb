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
# The version file: single versions and ranges; the config leaves the caller's
# CMAKE_MINIMUM_REQUIRED_VERSION alone.
mkdir -p "$work/range"
cat > "$work/range/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(sdpa_range C)
find_package(sdpa ${REQ} CONFIG QUIET)
if(NOT CMAKE_MINIMUM_REQUIRED_VERSION VERSION_EQUAL 3.20)
  message(FATAL_ERROR "find_package(sdpa) changed CMAKE_MINIMUM_REQUIRED_VERSION to ${CMAKE_MINIMUM_REQUIRED_VERSION}")
endif()
message(STATUS "sdpa_FOUND=${sdpa_FOUND}")
CMAKE
version=$(sed -n 's/^set(PACKAGE_VERSION "\([0-9.]*\)")$/\1/p' "$(dirname "$config")/sdpaConfigVersion.cmake")
IFS=. read -r major minor _ <<<"$version"
check_range() { # REQUEST EXPECTED(1|0)
  rm -rf "$work/range/b"
  out=$(cmake -S "$work/range" -B "$work/range/b" -DCMAKE_PREFIX_PATH="$prefix" -DREQ="$1")
  got=$(grep -q 'sdpa_FOUND=1' <<<"$out" && echo 1 || echo 0)
  if [ "$got" != "$2" ]; then
    echo "find_package(sdpa $1) against $version: found=$got, expected $2" >&2
    exit 1
  fi
}
check_range "$major.$minor" 1
check_range "$major.$((minor + 1))" 0
check_range "$major.$((minor - 1))...<$major.$minor" 0
check_range "$major.$((minor - 1))...$major.$((minor - 1))" 0
check_range "$major.$((minor - 1))...$major.$minor" 1
check_range "$major.$((minor - 1))...<$major.$((minor + 1))" 1
check_range "$((major + 1)).0...<$((major + 2)).0" 0
echo "version ranges and CMAKE_MINIMUM_REQUIRED_VERSION: OK"
echo "cmake consumer: OK"
