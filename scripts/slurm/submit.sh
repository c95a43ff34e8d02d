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
# (the commands are printed at submission, with KVBUDGET, SBATCH_* and the
# *_SBATCH_ARGS filled in). -n 1 is one shard, 0 of 1 (a folder -shard0of1, merged as
# any). The kvbudget run options may not hold those sweep.sbatch sets (--out,
# --no-plots, --threads, --shard, --resume): refused before anything is submitted.
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
# Options sweep.sbatch passes to kvbudget run itself: given again, every array task
# would fail ("cannot be specified more than once"), after the queue wait. Refused now.
# kvbudget takes an unambiguous prefix of an option (--thread, --no-plot), so prefixes
# of these count too.
set_by_script() {
  local name="${1%%=*}" opt
  [[ "$name" == --?* ]] || return 1
  for opt in --out --no-plots --threads --shard --resume; do
    [[ "$opt" == "$name"* ]] && return 0
  done
  return 1
}
for arg in "$@"; do
  if set_by_script "$arg"; then
    echo "$0: ${arg%%=*} is set by sweep.sbatch (--shard i/N --out OUT/shards --no-plots, --resume of a" \
      "requeued shard, --threads \$SLURM_CPUS_PER_TASK): leave it out of the kvbudget run options (results go" \
      "to OUT_DIR/shards and OUT_DIR/merged; threads: SWEEP_SBATCH_ARGS=\"--cpus-per-task=N\")" >&2
    exit 2
  fi
done
# The sbatch options of each job, as words (no globbing).
read -r -a sweep_sbatch_args <<<"${SWEEP_SBATCH_ARGS:-}"
read -r -a merge_sbatch_args <<<"${MERGE_SBATCH_ARGS:-}"
if [ -z "${KVBUDGET:-}" ]; then
  if [ -x "$here/../../build/kvbudget" ]; then KVBUDGET="$(realpath "$here/../../build/kvbudget")"; else KVBUDGET=kvbudget; fi
fi
export KVBUDGET
mkdir -p "$out/logs"
array=$(sbatch --parsable --array=0-$((shards - 1)) --job-name=kvb-sweep --output="$out/logs/sweep-%A_%a.out" \
  ${sweep_sbatch_args[@]+"${sweep_sbatch_args[@]}"} "$here/sweep.sbatch" -n "$shards" "$config" "$out" "$@")
array="${array%%;*}"
merge=$(sbatch --parsable --dependency="afterok:$array" --kill-on-invalid-dep=yes --job-name=kvb-merge \
  --output="$out/logs/merge-%j.out" ${merge_sbatch_args[@]+"${merge_sbatch_args[@]}"} "$here/merge.sbatch" "$out")
merge="${merge%%;*}"
echo "$array $merge"
# What to do when a shard does not finish: printed with this sweep's values filled in,
# the environment the jobs were submitted with included (the kvbudget binary, sbatch's
# own SBATCH_* settings), so that a rerun lands on the same kind of node.
environment="$(printf '%q ' "KVBUDGET=$KVBUDGET")"
while IFS= read -r variable; do
  environment+="$(printf '%q ' "$variable=${!variable}")"
done < <(compgen -e | grep '^SBATCH_' | sort)
rerun_shard="${environment}sbatch --array=<i> $(printf '%q ' --job-name=kvb-sweep --output="$out/logs/sweep-%A_%a.out" \
  ${sweep_sbatch_args[@]+"${sweep_sbatch_args[@]}"} "$here/sweep.sbatch" -n "$shards" "$config" "$out" "$@")"
rerun_merge="${environment}sbatch $(printf '%q ' --job-name=kvb-merge --output="$out/logs/merge-%j.out" \
  ${merge_sbatch_args[@]+"${merge_sbatch_args[@]}"} "$here/merge.sbatch" "$out")"
cat >&2 <<MSG
submitted: job array $array ($shards shards of $config) and merge job $merge (starts after every shard ended OK).
If a shard ends in TIMEOUT or FAILED (sacct -j $array), Slurm cancels merge job $merge (afterok).
Then run that shard <i> again (it resumes its folder, keeping its finished points):
  ${rerun_shard% }
and, once every shard is complete ($(printf '%q' "$KVBUDGET") status $(printf '%q' "$out")/shards/*/*-shard*), submit the merge by hand
(add --dependency=afterok:<that job's id> to start it when the rerun ends OK; it can run again: an earlier
merge's folder is moved aside, to $(printf '%q' "$out")/merged.<time>):
  ${rerun_merge% }
MSG
