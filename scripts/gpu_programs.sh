# Sourced by scripts/gpu_verify.sh and scripts/gpu_session.sh: finds the GPU programs.
#
#   source scripts/gpu_programs.sh; gpu_programs || exit 1
#
# Sets `bin` to an absolute directory laid out like a build (kvbudget, tests/gpu_test_*,
# bench/bench_cuda, bench/bench_cuda_forward) and `programs_line` to where they came from:
# $KVB_BIN_DIR (default build/) when it holds a CUDA build; else .gpu_stage/stage.tar.xz
# (scripts/gpu_stage.sh), unpacked once per stage into /tmp/kvb-gpu-stage-<its commit>
# (reused by later calls on a machine that stays up), with its libraries on
# LD_LIBRARY_PATH; else a build by scripts/setup.sh. Returns 1 when that build fails.
# Run from the repository root.
gpu_programs() {
  bin=${KVB_BIN_DIR:-build}
  if [ -x "$bin/tests/gpu_test_twins" ] && [ -x "$bin/bench/bench_cuda" ]; then
    programs_line="programs: $bin at $(git rev-parse HEAD 2>/dev/null)"
  elif [ -f .gpu_stage/stage.tar.xz ]; then
    local commit
    commit=$(tar -xJOf .gpu_stage/stage.tar.xz ./COMMIT | head -n 1)
    bin=/tmp/kvb-gpu-stage-${commit:0:12}
    if [ ! -f "$bin/.unpacked" ]; then
      rm -rf "$bin" && mkdir -p "$bin/tests" "$bin/bench"
      tar -C "$bin" -xJf .gpu_stage/stage.tar.xz
      mv "$bin/bin/gpu_test_"* "$bin/tests/"
      for b in bench_cuda bench_cuda_forward; do
        if [ -f "$bin/bin/$b" ]; then mv "$bin/bin/$b" "$bin/bench/"; fi
      done
      if [ -f "$bin/bin/kvbudget" ]; then mv "$bin/bin/kvbudget" "$bin/"; fi
      touch "$bin/.unpacked"
    fi
    export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    programs_line="programs: stage of $(head -n 1 "$bin/COMMIT") ($(sed -n 2p "$bin/COMMIT"))"
  else
    bash scripts/setup.sh || return 1
    programs_line="programs: built here at $(git rev-parse HEAD 2>/dev/null)"
  fi
  bin=$(cd "$bin" && pwd)
}
