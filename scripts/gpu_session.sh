#!/usr/bin/env bash
# The GPU measurements issues 20 and 21 still need, as named steps a device call runs in
# order, each under its own time limit, every log kept under OUT_DIR:
#
#   bash scripts/gpu_session.sh OUT_DIR STEP...     # e.g. verify hf8b decode8b
#   bash scripts/gpu_session.sh --list              # the steps, their limits and what they measure
#
# A lent device has a few minutes per call and per session: run the steps that matter
# most first, two or three per call (the machine stays up between calls, so the unpacked
# programs and the 8B checkpoint are reused). Programs: scripts/gpu_programs.sh (the
# stage of scripts/gpu_stage.sh, KVB_STAGE_CLI=1 for the kvbudget CLI). OUT_DIR gets
# STEP.log per step and summary.txt, one line per step: its exit status and seconds
# (124: cut at its limit; the log holds what it printed until then).
#
# Limits: KVB_STEP_LIMIT_<STEP> (seconds) overrides a step's default below. A device call
# sends back a few files only (2026-11-27: `verify`'s 12 logs did not come back): for a
# check of agreement alone, run `tests` (one log) rather than `verify`.
# Exit status: 77 without a device, 1 when a step failed, 0 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

# name|default limit, s|what it measures (issue and goal)
steps_table() {
  cat <<'TABLE'
tests|240|the four GPU test programs alone (twins, attention, forward, measurer), their output in one log (verify's part that decides agreement)
verify|420|every GPU test (twins, attention, forward, measurer), the quickstart on both backends, bench_cuda: scripts/gpu_verify.sh
hf8b|300|issue 21: Llama-3.1-8B-shaped random checkpoint, logits vs Hugging Face fp32 at 512 and 4096 tokens, CUDA backend (keeps the checkpoint)
decode8b|180|issue 21: bench_cuda_forward on that checkpoint, 4096 tokens teacher-forced and 32 greedy decoding steps
modelsweep|240|issue 21: bench_model_sweep.sh on that checkpoint, 20 points at 4096 tokens, CUDA (target: under 2 minutes)
peer|300|issue 20 goal 2: bench_gpu_peer.sh, kvbudget vs the PyTorch eager peer on the Llama-3-8B shape at 2048 tokens
long128k-cuda|420|issue 20 goal 4: configs/long_context_128k.toml (32 layers, 131072 tokens) on the CUDA backend, streamed; peak RSS
long128k-cpu|560|issue 20 goal 4: the same on the CPU backend, every core; peak RSS
threads|420|issue 20 goal 5: bench_cpu_threads.sh 1 2 4 8 16 with the phase table
TABLE
}

if [ "${1:-}" = "--list" ] || [ $# -lt 2 ]; then
  echo "usage: bash scripts/gpu_session.sh OUT_DIR STEP... (steps: name, default limit in s, what)"
  steps_table | awk -F'|' '{printf "  %-14s %4d s  %s\n", $1, $2, $3}'
  [ "${1:-}" = "--list" ] && exit 0 || exit 2
fi
out=$1
shift
for s in "$@"; do
  steps_table | cut -d'|' -f1 | grep -qx -- "$s" || { echo "gpu_session: unknown step '$s' (--list)" >&2; exit 2; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary="$out/summary.txt"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_session: no NVIDIA device (nvidia-smi -L failed): nothing measured" | tee -a "$summary"
  exit 77
fi
# shellcheck source=scripts/gpu_programs.sh
source scripts/gpu_programs.sh
gpu_programs || { echo "gpu_session: build failed" | tee -a "$summary"; exit 1; }
echo "$programs_line" >>"$summary"
export KVB_SOURCE_DIR=$repo KVB_DATA_DIR=$repo/data
ckpt=${KVB_SESSION_CHECKPOINTS:-/tmp/kvb-session-checkpoints}  # kept between calls
kvb=$bin/kvbudget

# Peak resident memory of a command (GNU time's "Maximum resident set size") goes to its log.
timed() { /usr/bin/time -v "$@"; }

run_step() {
  case $1 in
    tests)  # one log: the device call sends back only a handful of files
      local t rc=0
      for t in twins attention forward measurer; do
        echo "== gpu_test_$t"
        "$bin/tests/gpu_test_$t" || rc=1
      done
      return "$rc" ;;
    verify) bash scripts/gpu_verify.sh "$out/verify" ;;
    hf8b) python3 scripts/check_logits_hf.py --kvbudget "$kvb" --models llama-3.1-8b --tokens 512,4096 \
      --backend cuda --keep "$ckpt" ;;
    decode8b)
      if [ ! -f "$ckpt/llama-3.1-8b/config.json" ]; then
        python3 experiments/bench/make_checkpoint.py "$ckpt/llama-3.1-8b" --shape llama-3-8b || return 1
      fi
      "$bin/bench/bench_cuda_forward" "$ckpt/llama-3.1-8b" --tokens 4096 --repeats 2 --decode 32 --no-cpu ;;
    modelsweep)
      if [ ! -f "$ckpt/llama-3.1-8b/config.json" ]; then
        python3 experiments/bench/make_checkpoint.py "$ckpt/llama-3.1-8b" --shape llama-3-8b || return 1
      fi
      bash experiments/bench/bench_model_sweep.sh "$kvb" "$ckpt/llama-3.1-8b" 4096 cuda fp32 ;;
    peer) bash experiments/bench/bench_gpu_peer.sh "$kvb" ;;
    long128k-cuda) timed "$kvb" run configs/long_context_128k.toml --backend cuda --out "$out/runs" --no-plots ;;
    long128k-cpu) timed "$kvb" run configs/long_context_128k.toml --backend cpu --out "$out/runs" --no-plots ;;
    threads) bash experiments/bench/bench_cpu_threads.sh "$kvb" 1 2 4 8 16 ;;
  esac
}

failed=0
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw,clocks.max.sm --format=csv
  echo "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/device.txt" 2>&1
for s in "$@"; do
  default=$(steps_table | awk -F'|' -v s="$s" '$1 == s {print $2}')
  var="KVB_STEP_LIMIT_$(echo "$s" | tr 'a-z-' 'A-Z_')"
  limit=${!var:-$default}
  t0=$SECONDS
  echo "== $s (limit $limit s, load $(cut -d' ' -f1 /proc/loadavg)), $(date -u +%T) UTC" >"$out/$s.log"
  # The step runs in a subshell under `timeout`, its output in its log.
  export -f run_step timed
  export bin kvb ckpt out
  timeout --kill-after=10 "$limit" bash -c "run_step $s" >>"$out/$s.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || failed=1
  echo "$s rc=$rc $((SECONDS - t0))s (limit $limit s)" | tee -a "$summary"
done
exit "$failed"
