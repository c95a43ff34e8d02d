#!/usr/bin/env bash
# Submits a kvbudget sweep to Slurm as a job array of N shards plus a merge job that
# starts when every shard has finished (afterok):
#
#   scripts/slurm/submit.sh -n 8 configs/quickstart.toml results/slurm-quickstart [kvbudget run options]
#
# Array task i runs `kvbudget run CONFIG --shard i/N --no-plots` (sweep.sbatch -n N)
# into OUT/shards/<name>/<timestamp>-shard<i>of<N>/; the merge job (merge.sbatch)
# writes OUT/merged/ with the plots, equal to what one `kvbudget run CONFIG` would write
# (timing columns aside). Logs: OUT/logs/. Prints the two job ids ("ARRAY_ID MERGE_ID")
# on stdout, and on stderr what to do when a shard fails.
#
# A shard that was killed (node failure, time limit, scancel) is continued, not
# restarted, when its array task runs again (scontrol requeue, or
# `sbatch --array=<i> ... sweep.sbatch -n N CONFIG OUT ...` by hand): sweep.sbatch
# resumes its folder. A shard that ends in TIMEOUT or FAILED makes Slurm cancel the
# merge job (afterok); once the shard has been run again, submit merge.sbatch by hand
# (the commands are printed at submission).
#
# Environment: KVBUDGET (the kvbudget binary; default: build/kvbudget of this
# checkout, else `kvbudget` on PATH); sbatch's own SBATCH_PARTITION, SBATCH_TIMELIMIT,
# SBATCH_ACCOUNT, ... apply to both jobs; SWEEP_SBATCH_ARGS / MERGE_SBATCH_ARGS add
# sbatch options to one of them (e.g. "--cpus-per-task=16 --mem=64G").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
shards=4
if [ "${1:-}" = "-n" ]; then
  shards="$2"
  shift 2
fi
if [ $# -lt 2 ]; then
  echo "usage: $0 [-n SHARDS] CONFIG OUT_DIR [kvbudget run options...]" >&2
  exit 2
fi
case "$shards" in '' | *[!0-9]* | 0) echo "$0: -n wants a positive number of shards, not '$shards'" >&2; exit 2 ;; esac
config="$(realpath "$1")"
out="$(realpath -m "$2")"
shift 2
if [ -z "${KVBUDGET:-}" ]; then
  if [ -x "$here/../../build/kvbudget" ]; then KVBUDGET="$(realpath "$here/../../build/kvbudget")"; else KVBUDGET=kvbudget; fi
fi
export KVBUDGET
mkdir -p "$out/logs"
# shellcheck disable=SC2086  # the *_SBATCH_ARGS are word lists
array=$(sbatch --parsable --array=0-$((shards - 1)) --job-name=kvb-sweep --output="$out/logs/sweep-%A_%a.out" \
  ${SWEEP_SBATCH_ARGS:-} "$here/sweep.sbatch" -n "$shards" "$config" "$out" "$@")
array="${array%%;*}"
# shellcheck disable=SC2086
merge=$(sbatch --parsable --dependency="afterok:$array" --kill-on-invalid-dep=yes --job-name=kvb-merge \
  --output="$out/logs/merge-%j.out" ${MERGE_SBATCH_ARGS:-} "$here/merge.sbatch" "$out")
merge="${merge%%;*}"
echo "$array $merge"
# What to do when a shard does not finish: printed with this sweep's values filled in.
rerun_shard="sbatch --array=<i> $(printf '%q ' --job-name=kvb-sweep --output="$out/logs/sweep-%A_%a.out" \
  "$here/sweep.sbatch" -n "$shards" "$config" "$out" "$@")"
rerun_merge="sbatch $(printf '%q ' --job-name=kvb-merge --output="$out/logs/merge-%j.out" "$here/merge.sbatch" "$out")"
cat >&2 <<MSG
submitted: job array $array ($shards shards of $config) and merge job $merge (starts after every shard ended OK).
If a shard ends in TIMEOUT or FAILED (sacct -j $array), Slurm cancels merge job $merge (afterok).
Then run that shard <i> again (it resumes its folder, keeping its finished points):
  ${rerun_shard% }
and, once every shard is complete (kvbudget status $out/shards/*/*-shard*), submit the merge by hand
(add --dependency=afterok:<that job's id> to start it when the rerun ends OK):
  ${rerun_merge% }
MSG
