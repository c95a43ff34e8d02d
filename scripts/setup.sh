#!/usr/bin/env bash
# Installs what kvbudget needs on Debian 12 (only the missing packages) and builds it
# into build/. Safe to run again: it then only rebuilds what changed.
#
#   bash scripts/setup.sh            # Release build in build/
#   BUILD_DIR=build-debug CMAKE_BUILD_TYPE=Debug bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
CMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release}

# Build tools and libraries (all Debian packages), plus Debian's python3 with numpy,
# matplotlib (plots) and nbconvert/ipykernel (notebooks, executed by the tests), and
# Slurm with munge (tests/cli/test_slurm.sh starts a one-node cluster in a scratch
# directory; no daemon is enabled or configured system-wide), and pybind11, pandas and
# pytest for the Python package (python/kvbudget), and PyTorch (CPU) for its recorder of
# PyTorch models (kvbudget.TorchRecorder; its tests skip without it). OpenBLAS runs the
# attention-metric path's fp32 GEMMs (CMake option KVB_BLAS; Eigen without it).
packages=(
  build-essential cmake pkg-config git
  libeigen3-dev libopenblas-dev libboost-program-options-dev doctest-dev libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev
  python3 python3-numpy python3-matplotlib python3-nbformat python3-nbconvert python3-ipykernel jupyter-nbconvert
  slurm-wlm munge
  python3-dev pybind11-dev python3-pybind11 python3-pandas python3-pytest python3-torch
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# CUDA is optional: CMake enables it when nvcc is found (PATH or /usr/local/cuda).
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$CMAKE_BUILD_TYPE" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

# The Python package: `import kvbudget` in /usr/bin/python3 finds the build's
# $BUILD_DIR/python through a .pth file in that interpreter's site-packages
# (/usr/local/lib/python3.X/dist-packages); rebuilding updates it in place.
if [ -d "$BUILD_DIR/python/kvbudget" ]; then
  site=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo mkdir -p "$site"
  echo "$(cd "$BUILD_DIR/python" && pwd)" | $sudo tee "$site/kvbudget.pth" >/dev/null
  echo "setup: kvbudget Python package importable from /usr/bin/python3 ($site/kvbudget.pth)"
fi
