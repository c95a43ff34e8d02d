#!/usr/bin/env bash
# Builds kvbudget (installing missing packages) and runs every test. GPU tests report
# "skipped" (exit code 77) where no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@"
