#!/usr/bin/env bash
# Builds kvbudget (installing missing packages) and runs the tests. GPU tests report
# "skipped" (exit code 77) where no CUDA device is present.
#
#   bash scripts/test.sh            # every tier (what CI runs)
#   bash scripts/test.sh --quick    # the unit tier alone (about 20 s once built)
#   bash scripts/test.sh -L cli     # one tier; any other arguments go to ctest
#
# Tiers are CTest labels (tests/CMakeLists.txt): unit, cli, notebook, gpu, and slow on
# the tests that take about a minute or start services.
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for a in "$@"; do
  if [ "$a" = "--quick" ]; then args+=(-L unit); else args+=("$a"); fi
done
bash scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "${args[@]}"
