#!/usr/bin/env bash
# Sanitizer stage (issue 26 item 1): the C++ unit tests (tests/cpp) built with
# ASan+UBSan in build/asan and with TSan in build/tsan. Both builds are torch-free
# (-Dtorch_free=true: trace, fusion, backend core and the tests only), -O1 with line
# tables, and leave build/py alone. Each folder is configured once; later runs rebuild
# what changed. GCC's own runtimes (libasan, libubsan, libtsan from libgcc-12-dev, which
# g++ pulls in) are all it needs. Both stages run every C++ unit test: the threaded ones
# (streams and events in test_device_memory, the key lock and compiler in
# test_native_cache, the cache tests) are why TSan runs, the rest cost seconds.
# No suppressions: both runs are clean without any.
# Usage: tools/sanitize.sh [asan|tsan]...   (both by default); NINJA_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${NINJA_JOBS:-2}
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1
export TSAN_OPTIONS=halt_on_error=1

stage() {  # name, sanitizers
  local dir=build/$1 start=$SECONDS
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dtorch_free=true -Dbuildtype=plain -Doptimization=1 \
      -Dcpp_args='-g1 -fno-omit-frame-pointer' -Db_sanitize="$2" -Db_lundef=false >/dev/null
  fi
  if ! ninja -C "$dir" -j "$JOBS" >"$dir/sanitize-build.log" 2>&1; then
    tail -n 60 "$dir/sanitize-build.log" >&2
    echo "[sanitize] $1: build failed (log: $dir/sanitize-build.log)" >&2
    exit 1
  fi
  meson test -C "$dir" --suite cpp --no-rebuild --print-errorlogs --num-processes "$JOBS"
  echo "[sanitize] $1 ($2): clean, $((SECONDS - start)) s"
}

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(asan tsan)
for s in "${stages[@]}"; do
  case $s in
    asan) stage asan address,undefined ;;
    tsan) stage tsan thread ;;
    *) echo "unknown stage $s (asan|tsan)" >&2; exit 2 ;;
  esac
done
