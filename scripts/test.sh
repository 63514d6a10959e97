#!/usr/bin/env bash
# Installs what is missing, builds everything with warnings as errors, runs the whole suite
# through ctest (units, process, end-to-end, store, logs, worker library, PyTorch compatibility,
# rendezvous, reliability: every folder under tests/), then builds the suite again under
# ASan+UBSan in a second build directory and runs it there. CTRUN_ASAN=0 skips the second pass
# (a quicker local run; CI never sets it).
#
# Every option that decides what the suite contains is given here on each run, so a build
# directory configured before with fewer parts (./scripts/demo.sh, run first, caches
# CTRUN_BUILD_TESTS=OFF; a copy of the second pass's flags caches a skipped area) is reconfigured,
# not reused as it is; and ctest fails when it finds no tests at all.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" -DCTRUN_WERROR=ON -DCTRUN_BUILD_TESTS=ON -DCTRUN_TEST_AREAS=all \
  -DCTRUN_TEST_AREAS_SKIP= -DCTRUN_SANITIZE=OFF -DCTRUN_CLANG_FUZZERS=ON \
  -DCTRUN_BUILD_EXAMPLES=ON -DCTRUN_WITH_TORCH=ON -DCTRUN_BUILD_BENCH=ON
build="${CTRUN_BUILD_DIR:-$root/build}"
(cd "$build" && ctest --output-on-failure --no-tests=error -j "$(nproc)" --timeout 600)

[[ "${CTRUN_ASAN:-1}" == 1 ]] || exit 0
# Second pass: ASan+UBSan (CTRUN_SANITIZE=ON), its own build directory, -O1 -g1 (the usual
# sanitizer level: stacks with file and line, about half the compile time of -O2 -g). Left out
# there, with reasons:
#  - LibTorch (-DCTRUN_WITH_TORCH=OFF): the examples, the LibTorch worker helpers and the chaos tests
#    that run them. LibTorch itself is not instrumented, and compiling its heavy headers again with
#    ASan would cost more than the rest of the build; ctrun, the code under test, links no LibTorch.
#  - tests/compat: the PyTorch compatibility tests run Python torch workers for minutes; the
#    instrumented ctrun is exercised by the e2e, process, rendezvous and reliability tests instead.
#  - tests/install: it builds and inspects the Debian packages, which are made from the first
#    pass's build, not from an instrumented one.
#  - the libFuzzer targets: ASan+UBSan builds already, run in the first pass.
asan="${CTRUN_ASAN_BUILD_DIR:-$root/build-asan}"
CTRUN_BUILD_DIR="$asan" "$root/scripts/build.sh" -DCTRUN_SANITIZE=ON -DCTRUN_WERROR=ON -DCTRUN_BUILD_TESTS=ON \
  -DCTRUN_TEST_AREAS=all "-DCTRUN_TEST_AREAS_SKIP=compat;install" -DCTRUN_CLANG_FUZZERS=OFF \
  -DCTRUN_BUILD_EXAMPLES=ON -DCTRUN_WITH_TORCH=OFF -DCTRUN_BUILD_BENCH=OFF \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
(cd "$asan" && UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure --no-tests=error -j "$(nproc)" --timeout 600)
