#!/usr/bin/env bash
# Builds kvbudget and runs the attention-metric benchmark against its NumPy peer
# (experiments/bench/bench_metrics.cpp, peer_numpy.py). Installs OpenBLAS first so that
# NumPy is the fair peer a researcher would have (Debian's numpy otherwise runs on the
# reference BLAS); the benchmark prints which BLAS library NumPy loaded.
#
#   bash scripts/bench.sh [--repeats N] [--rounds R] [--markdown]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q "install ok installed"; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libopenblas0-pthread >/dev/null
fi
bash scripts/setup.sh
"${BUILD_DIR:-build}/bench/bench_metrics" "$@"
