#!/usr/bin/env bash
# Builds kvbudget (installing missing packages) and runs the quickstart experiment on
# the bundled gpt2-bytes recording: results and Pareto plots in results/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build/kvbudget run configs/quickstart.toml "$@"
echo "Pareto plots: $(pwd)/results/quickstart/latest/plots/"
