#!/usr/bin/env bash
# Builds kvbudget (installing missing packages) and runs the quickstart experiment on
# the bundled gpt2-bytes recording: results and Pareto plots in results/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# kvbudget prints where this run's results and plots went (--out moves them).
build/kvbudget run configs/quickstart.toml "$@"
