#!/usr/bin/env bash
# Builds the GPU programs on a machine that has nvcc but maybe no GPU, and packs them for a
# GPU machine that has the NVIDIA driver and CUDA's cuBLAS but not kvbudget's build
# dependencies (Eigen, Boost, toml++ ... are compiled in or packed here):
#
#   bash scripts/gpu_stage.sh            # -> .gpu_stage/stage.tar.xz (git-ignored)
#
# then, on the GPU machine, in a copy of this repository with .gpu_stage/ beside it:
#
#   bash scripts/gpu_verify.sh OUT_DIR   # unpacks the stage, runs the GPU tests and bench
#
# The build is portable (x86-64-v3, no -march=native) for Hopper (sm_90) by default;
# KVB_CUDA_ARCH=80 bash scripts/gpu_stage.sh builds for another architecture. The stage
# holds the GPU tests and bench_cuda (about 2.6 MB); KVB_STAGE_CLI=1 adds the kvbudget
# CLI (1.7 MB more) for gpu_verify's quickstart comparison on both backends
# (tests/gpu/test_attention.cpp runs that sweep comparison without the CLI).
set -euo pipefail
cd "$(dirname "$0")/.."

STAGE_BUILD=${STAGE_BUILD:-build-gpu-stage}
CUDA_ARCH=${KVB_CUDA_ARCH:-90}
STAGE_DIR=.gpu_stage
programs=(tests/gpu_test_twins tests/gpu_test_attention tests/gpu_test_forward tests/gpu_test_measurer bench/bench_cuda
  bench/bench_cuda_forward)
if [ "${KVB_STAGE_CLI:-0}" = 1 ]; then programs+=(kvbudget); fi

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "gpu_stage: nvcc not found (PATH or /usr/local/cuda/bin): nothing to stage" >&2
  exit 1
fi
# The packages; also proves the normal build works (KVB_STAGE_SKIP_SETUP=1 skips it where
# the packages are known to be there and a full build would only cost time).
if [ "${KVB_STAGE_SKIP_SETUP:-0}" != 1 ]; then bash scripts/setup.sh >/dev/null; fi

# KVB_BLAS=OFF: the CPU side's attention-metric GEMMs on Eigen, so that OpenBLAS (36 MB,
# 5 MB packed, with libgfortran) stays out of the stage, which travels with the tree.
cmake -S . -B "$STAGE_BUILD" -DCMAKE_BUILD_TYPE=Release -DKVB_NATIVE=OFF -DKVB_BLAS=OFF \
  -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" >/dev/null
targets=()
for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
cmake --build "$STAGE_BUILD" -j"$(nproc)" --target "${targets[@]}"

rm -rf "$STAGE_DIR/pack"
mkdir -p "$STAGE_DIR/pack/bin" "$STAGE_DIR/pack/lib"
for p in "${programs[@]}"; do
  install -m 755 "$STAGE_BUILD/$p" "$STAGE_DIR/pack/bin/"
  strip --strip-unneeded "$STAGE_DIR/pack/bin/$(basename "$p")"
done
# Shared libraries that a CUDA image may lack: everything the programs need except the C
# library, the dynamic loader and CUDA's own (the driver and cuBLAS come from the GPU
# machine, which must match what they were built against).
for p in "$STAGE_DIR"/pack/bin/*; do
  ldd "$p" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*) ;;
    *) cp -L "$lib" "$STAGE_DIR/pack/lib/" ;;
  esac
done
git rev-parse HEAD >"$STAGE_DIR/pack/COMMIT"
printf 'arch=sm_%s\nbuilt=%s\nhost=%s\n' "$CUDA_ARCH" "$(date -u +%FT%TZ)" "$(uname -srm)" >>"$STAGE_DIR/pack/COMMIT"
tar -C "$STAGE_DIR/pack" -cf - . | xz -9e >"$STAGE_DIR/stage.tar.xz"
rm -rf "$STAGE_DIR/pack"

stage_kib=$(du -k "$STAGE_DIR/stage.tar.xz" | cut -f1)
tree_kib=$(git ls-files -z | xargs -0 du -kc | tail -n 1 | cut -f1)
echo "gpu_stage: $STAGE_DIR/stage.tar.xz ($stage_kib KiB) for $(git rev-parse --short HEAD), sm_$CUDA_ARCH"
echo "gpu_stage: tracked files $tree_kib KiB + stage $stage_kib KiB = $((tree_kib + stage_kib)) KiB"
