#!/usr/bin/env bash
# scripts/slurm/ without a Slurm cluster (quick; test_slurm.sh runs them on a real one):
# sweep.sbatch run by hand with the variables an array task gets, and submit.sh with a
# stand-in sbatch that records its arguments.
#   - A rerun of one shard by hand (`sbatch --array=2 ... sweep.sbatch -n 4`, a one-task
#     array) runs shard 2 of 4, not the whole sweep; without -n it is refused.
#   - A finished shard folder is resumed (nothing to run), not skipped on its status; a
#     folder of another config name is not taken for this shard's; a different config of
#     the same name is refused by --resume.
#   - A plot failure on the compute node does not fail the shard (--no-plots: the merge
#     draws the plots the config asks for); where a plot failure does fail a run, the
#     manifest's `error` and `status` say why.
#   - submit.sh passes the shard count to sweep.sbatch and says what to do when a shard
#     ends in TIMEOUT or FAILED (the merge job is cancelled): the printed commands, run,
#     submit what submit.sh did (its sbatch options and environment included).
#   - submit.sh refuses the kvbudget run options sweep.sbatch sets itself; -n 1 makes a
#     shard 0 of 1 that resumes and merges; --set 'name="x"' is the name x.
#   - merge.sbatch runs again after a failed merge (the earlier folder moved aside).
#   - A config outside the source tree with a data path relative to its own folder:
#     shards, merge.sbatch and `run --resume DIR` (no CONFIG) from other working
#     directories find the data from the original config's folder.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
sweep="$src/scripts/slurm/sweep.sbatch"

config() {  # config FILE NAME: 14 points on small synthetic data, plots on
  cat >"$1" <<TOML
name = "$2"
[data.synthetic]
layers = 1
q_heads = 2
head_dim = 32
tokens = 64
[[strategy]]
type = "uniform"
format = "int{bits}-{mode}-g32"
[strategy.vars]
bits = "2..8"
mode = ["sym", "asym"]
[output]
plots = true
TOML
}
config "$tmp/sw.toml" sw
config "$tmp/other.toml" other
# An interpreter that cannot plot: a plot step on the compute node would fail the shard.
export KVB_PYTHON=/bin/false
# array_task ID MIN MAX COUNT command...: with the variables Slurm sets for an array task.
array_task() { env SLURM_ARRAY_TASK_ID="$1" SLURM_ARRAY_TASK_MIN="$2" SLURM_ARRAY_TASK_MAX="$3" \
  SLURM_ARRAY_TASK_COUNT="$4" KVBUDGET="$kvb" "${@:5}"; }
out="$tmp/out"

# A rerun of shard 2 by hand: a one-task array (--array=2) that is shard 2 of 4.
array_task 2 2 2 1 bash "$sweep" -n 4 "$tmp/sw.toml" "$out" --quiet >"$tmp/one.out" 2>&1 \
  || fail "shard 2/4 in a one-task array exited $?: $(cat "$tmp/one.out")"
shard2=$(ls -d "$out"/shards/sw/*-shard2of4 2>/dev/null)
[ -n "$shard2" ] || fail "no shard 2 of 4 folder: $(ls -R "$out" 2>&1 | head)"
[ "$(ls "$out"/shards/sw | grep -v '^latest$' | grep -vc -- '-shard2of4$')" -eq 0 ] \
  || fail "the one-task array ran something else than shard 2 of 4: $(ls "$out"/shards/sw)"
rows=$(($(wc -l <"$shard2/points.csv") - 1))
[ "$rows" -ge 3 ] && [ "$rows" -le 4 ] || fail "shard 2 of 4 of 14 points has $rows points"
expect "$shard2/manifest.json" '"status": "complete"' "shard 2's manifest (the plots are the merge's)"
[ ! -d "$shard2/plots" ] || fail "the shard drew plots"
# Without -n: refused (the count cannot come from a one-task array).
array_task 2 2 2 1 bash "$sweep" "$tmp/sw.toml" "$out" --quiet >"$tmp/no_n.out" 2>&1
[ $? -eq 2 ] || fail "sweep.sbatch without -n: expected exit 2"
expect "$tmp/no_n.out" "-n wants the sweep's number of shards" "sweep.sbatch without -n"
array_task 5 0 7 8 bash "$sweep" -n 4 "$tmp/sw.toml" "$out" --quiet >"$tmp/big.out" 2>&1
[ $? -eq 2 ] || fail "array task 5 of -n 4: expected exit 2"
expect "$tmp/big.out" "array task 5 is not a shard of 4" "array task beyond -n"

# The same task again: its finished folder is resumed (nothing runs), not made anew.
cp "$shard2/points.csv" "$tmp/points2.csv"
array_task 2 0 3 4 bash "$sweep" -n 4 "$tmp/sw.toml" "$out" --quiet >"$tmp/again.out" 2>&1 \
  || fail "shard 2 again exited $?: $(cat "$tmp/again.out")"
expect "$tmp/again.out" "resuming $shard2" "a finished shard's task run again"
expect "$shard2/manifest.json" "\"points_resumed\": $rows" "the resumed finished shard"
[ "$(ls -d "$out"/shards/sw/*-shard2of4* | wc -l)" -eq 1 ] || fail "a finished shard's rerun made a new folder"
[ "$(numbers "$tmp/points2.csv")" = "$(numbers "$shard2/points.csv")" ] || fail "resuming a finished shard changed it"
# Another config's shard 2 of 4 in the same OUT: a folder of its own, not this one resumed.
array_task 2 0 3 4 bash "$sweep" -n 4 "$tmp/other.toml" "$out" --quiet >"$tmp/other.out" 2>&1 \
  || fail "another config's shard 2 exited $?: $(cat "$tmp/other.out")"
[ -n "$(ls -d "$out"/shards/other/*-shard2of4 2>/dev/null)" ] || fail "another config's shard resumed this one's folder"
if grep -q "resuming" "$tmp/other.out"; then fail "another config's shard resumed a folder: $(cat "$tmp/other.out")"; fi
# The same name with another seed: --resume refuses (a different sweep), exit 2.
array_task 2 0 3 4 bash "$sweep" -n 4 "$tmp/sw.toml" "$out" --quiet --set seed=7 >"$tmp/seed.out" 2>&1
[ $? -eq 2 ] || fail "a different config of the same name: expected exit 2"
expect "$tmp/seed.out" "not the same sweep" "a different config of the same name"
# --set name=... picks that name's folders.
array_task 2 0 3 4 bash "$sweep" -n 4 "$tmp/sw.toml" "$out" --quiet --set name=renamed >"$tmp/renamed.out" 2>&1 \
  || fail "a renamed shard exited $?: $(cat "$tmp/renamed.out")"
[ -n "$(ls -d "$out"/shards/renamed/*-shard2of4 2>/dev/null)" ] || fail "--set name=renamed: no folder of its own"
if grep -q "resuming" "$tmp/renamed.out"; then fail "--set name=renamed resumed another name's folder"; fi

# The other shards, then the merge: it draws the plots the config asks for, which the
# shards (--no-plots) left to it.
# (An OUT of its own: merge.sbatch merges every shard folder under OUT/shards.)
for i in 0 1 2 3; do
  array_task "$i" 0 3 4 bash "$sweep" -n 4 "$tmp/sw.toml" "$tmp/whole" --quiet >"$tmp/shard$i.out" 2>&1 \
    || fail "shard $i/4 exited $?: $(cat "$tmp/shard$i.out")"
done
# A merge whose plots fail (KVB_PYTHON=/bin/false) writes OUT/merged/ and exits 1; run
# again (the printed recovery), it moves that folder aside and merges anew.
KVBUDGET="$kvb" bash "$src/scripts/slurm/merge.sbatch" "$tmp/whole" >"$tmp/merge_failed.out" 2>&1
[ $? -eq 1 ] || fail "merge.sbatch with failing plots: expected exit 1: $(cat "$tmp/merge_failed.out")"
expect "$tmp/whole/merged/manifest.json" '"status": "failed"' "the failed merge's manifest"
env -u KVB_PYTHON KVBUDGET="$kvb" bash "$src/scripts/slurm/merge.sbatch" "$tmp/whole" >"$tmp/merge.out" 2>&1 \
  || fail "merge.sbatch exited $?: $(cat "$tmp/merge.out")"
[ -s "$tmp/whole/merged/plots/attn_kl_mean.png" ] || fail "the merge drew no plots for shards run with --no-plots"
expect "$tmp/whole/merged/manifest.json" '"status": "complete"' "the merged manifest"
aside=$(ls -d "$tmp"/whole/merged.2* 2>/dev/null)
if [ -n "$aside" ]; then expect "$aside/manifest.json" '"status": "failed"' "the earlier merge moved aside"
else fail "the earlier merge was not moved aside: $(ls "$tmp/whole")"; fi
expect "$tmp/merge.out" "moved to $aside" "merge.sbatch run again"
bash "$src/scripts/slurm/merge.sbatch" >"$tmp/merge_usage.out" 2>&1
[ $? -eq 2 ] || fail "merge.sbatch without OUT_DIR: expected exit 2"
expect "$tmp/merge_usage.out" "usage: merge.sbatch OUT_DIR" "merge.sbatch without OUT_DIR"

# What --no-plots spares a shard: a run that cannot plot fails, and says why (the
# manifest's `error`, printed by status instead of a resume hint).
"$kvb" run "$tmp/sw.toml" --quiet --out "$tmp/plotting" >"$tmp/plotting.out" 2>&1
[ $? -eq 1 ] || fail "a run whose plots fail: expected exit 1"
plotting=$(ls -d "$tmp"/plotting/sw/2*)
expect "$plotting/manifest.json" '"error": "plots not written: ' "the failed run's manifest"
"$kvb" status "$plotting" >"$tmp/plotting_status.out" 2>&1
expect "$tmp/plotting_status.out" "error: plots not written: " "status of a run whose plots failed"
if grep -q -- "--resume" "$tmp/plotting_status.out"; then fail "status suggests --resume for a failed plot step"; fi

# submit.sh with a stand-in sbatch: it records its arguments and prints a job id.
mkdir -p "$tmp/bin"
cat >"$tmp/bin/sbatch" <<'SH'
#!/usr/bin/env bash
printf '%s [KVBUDGET=%s SBATCH_PARTITION=%s]\n' "$*" "${KVBUDGET:-}" "${SBATCH_PARTITION:-}" >>"$SBATCH_LOG"
n=$(wc -l <"$SBATCH_LOG")
echo "$((100 + n))"
SH
chmod +x "$tmp/bin/sbatch"
PATH="$tmp/bin:$PATH" SBATCH_LOG="$tmp/sbatch.log" KVBUDGET="$kvb" \
  bash "$src/scripts/slurm/submit.sh" -n 4 "$tmp/sw.toml" "$tmp/sub" --quiet >"$tmp/submit.out" 2>"$tmp/submit.err" \
  || fail "submit.sh exited $?: $(cat "$tmp/submit.err")"
[ "$(cat "$tmp/submit.out")" = "101 102" ] || fail "submit.sh printed '$(cat "$tmp/submit.out")', not the two job ids"
expect "$tmp/sbatch.log" "--array=0-3" "the array job's sbatch"
expect "$tmp/sbatch.log" "sweep.sbatch -n 4 $tmp/sw.toml $tmp/sub --quiet" "the shard count passed to sweep.sbatch"
expect "$tmp/sbatch.log" "--dependency=afterok:101" "the merge job's sbatch"
expect "$tmp/submit.err" "TIMEOUT or FAILED" "submit.sh's message"
expect "$tmp/submit.err" "cancels merge job 102 (afterok)" "submit.sh's message"
expect "$tmp/submit.err" "sbatch --array=<i> " "submit.sh's message"
expect "$tmp/submit.err" "sweep.sbatch -n 4 $tmp/sw.toml $tmp/sub --quiet" "submit.sh's message"
expect "$tmp/submit.err" "merge.sbatch $tmp/sub" "submit.sh's message"

# The printed commands submit what submit.sh submitted (array index and dependency
# aside): its sbatch options and environment (KVBUDGET, SBATCH_*) included, when run from
# a shell that has neither.
rm -f "$tmp/sbatch.log"
PATH="$tmp/bin:$PATH" SBATCH_LOG="$tmp/sbatch.log" KVBUDGET="$kvb" SBATCH_PARTITION=gpu \
  SWEEP_SBATCH_ARGS="--cpus-per-task=4 --time=1:00:00 --gres=gpu:1" MERGE_SBATCH_ARGS="--mem=1G" \
  bash "$src/scripts/slurm/submit.sh" -n 4 "$tmp/sw.toml" "$tmp/sub" --quiet >/dev/null 2>"$tmp/submit_args.err" \
  || fail "submit.sh with sbatch options exited $?: $(cat "$tmp/submit_args.err")"
rerun_shard=$(grep -F 'sbatch --array=<i> ' "$tmp/submit_args.err")
rerun_merge=$(grep -F 'merge.sbatch' "$tmp/submit_args.err" | grep -vF -- '--array')
(export PATH="$tmp/bin:$PATH" SBATCH_LOG="$tmp/sbatch.log"; unset KVBUDGET SBATCH_PARTITION
 eval "${rerun_shard//<i>/2}"; eval "$rerun_merge") >/dev/null || fail "the printed commands failed"
[ "$(sed -n 3p "$tmp/sbatch.log")" = "$(sed -n 1p "$tmp/sbatch.log" | sed 's/--parsable --array=0-3/--array=2/')" ] \
  || fail "the printed shard rerun submits '$(sed -n 3p "$tmp/sbatch.log")', not '$(sed -n 1p "$tmp/sbatch.log")'"
[ "$(sed -n 4p "$tmp/sbatch.log")" = "$(sed -n 2p "$tmp/sbatch.log" | sed 's/--parsable --dependency=afterok:[0-9]* --kill-on-invalid-dep=yes //')" ] \
  || fail "the printed merge submits '$(sed -n 4p "$tmp/sbatch.log")', not '$(sed -n 2p "$tmp/sbatch.log")'"
expect "$tmp/sbatch.log" "--gres=gpu:1 $src/scripts/slurm/sweep.sbatch" "the array job's sbatch options"
expect "$tmp/sbatch.log" "--mem=1G $src/scripts/slurm/merge.sbatch" "the merge job's sbatch options"
expect "$tmp/sbatch.log" "[KVBUDGET=$kvb SBATCH_PARTITION=gpu]" "the jobs' environment"

# Options sweep.sbatch sets itself: refused by submit.sh before anything is submitted
# (every array task would fail), and by sweep.sbatch.
for option in "--threads 1" "--threads=1" "--no-plots" "--out $tmp/elsewhere" "--shard 0/2" "--resume $tmp" \
  "--thread 1" "--no-plot" "--ou=$tmp/elsewhere"; do  # and their prefixes, which kvbudget takes
  rm -f "$tmp/sbatch.log"
  # shellcheck disable=SC2086  # the option and its value as two words
  PATH="$tmp/bin:$PATH" SBATCH_LOG="$tmp/sbatch.log" KVBUDGET="$kvb" \
    bash "$src/scripts/slurm/submit.sh" -n 2 "$tmp/sw.toml" "$tmp/sub" --quiet $option >/dev/null 2>"$tmp/refused.err"
  [ $? -eq 2 ] || fail "submit.sh ... $option: expected exit 2"
  expect "$tmp/refused.err" "${option%%[ =]*} is set by sweep.sbatch" "submit.sh ... $option"
  [ ! -e "$tmp/sbatch.log" ] || fail "submit.sh ... $option submitted: $(cat "$tmp/sbatch.log")"
done
array_task 0 0 1 2 bash "$sweep" -n 2 "$tmp/sw.toml" "$tmp/sub" --quiet --no-plots >"$tmp/refused.out" 2>&1
[ $? -eq 2 ] || fail "sweep.sbatch ... --no-plots: expected exit 2"
expect "$tmp/refused.out" "--no-plots is set by this script" "sweep.sbatch ... --no-plots"

# -n 1: shard 0 of 1, in a folder named so (-shard0of1): run again it resumes that
# folder, and merge.sbatch merges it.
for attempt in 1 2; do
  array_task 0 0 0 1 bash "$sweep" -n 1 "$tmp/sw.toml" "$tmp/one" --quiet --set output.plots=false \
    >"$tmp/one$attempt.out" 2>&1 || fail "sweep.sbatch -n 1 (attempt $attempt) exited $?: $(cat "$tmp/one$attempt.out")"
done
one=$(ls -d "$tmp"/one/shards/sw/*-shard0of1 2>/dev/null)
[ -n "$one" ] || fail "sweep.sbatch -n 1 made no -shard0of1 folder: $(ls "$tmp"/one/shards/sw)"
[ "$(ls "$tmp"/one/shards/sw | grep -vc '^latest$')" -eq 1 ] || fail "sweep.sbatch -n 1 run again made another folder"
expect "$tmp/one2.out" "resuming $one" "sweep.sbatch -n 1 run again"
KVBUDGET="$kvb" bash "$src/scripts/slurm/merge.sbatch" "$tmp/one" >"$tmp/one_merge.out" 2>&1 \
  || fail "merge.sbatch of one shard exited $?: $(cat "$tmp/one_merge.out")"
expect "$tmp/one/merged/manifest.json" '"status": "complete"' "the merge of one shard"

# --set 'name="x"' (a TOML string) names the folder x: the task run again resumes it.
for attempt in 1 2; do
  array_task 3 0 3 4 bash "$sweep" -n 4 "$tmp/sw.toml" "$tmp/quoted" --quiet --set 'name="quoted"' \
    >"$tmp/quoted$attempt.out" 2>&1 || fail "--set 'name=\"quoted\"' (attempt $attempt) exited $?: $(cat "$tmp/quoted$attempt.out")"
done
quoted=$(ls -d "$tmp"/quoted/shards/quoted/*-shard3of4 2>/dev/null)
[ "$(printf '%s' "$quoted" | grep -c .)" -eq 1 ] \
  || fail "--set 'name=\"quoted\"': not one shards/quoted/ folder: $(ls -R "$tmp/quoted/shards" | head)"
expect "$tmp/quoted2.out" "resuming $quoted" "--set 'name=\"quoted\"' run again"

# A config outside the source tree, its data path relative to its own folder: the shards
# run from one working directory, merge.sbatch and --resume (no CONFIG) from another.
mkdir -p "$tmp/proj/recs" "$tmp/cwd1" "$tmp/cwd2"
cp "$src/data/records/gpt2-bytes-record.safetensors" "$tmp/proj/recs/r.safetensors"
cat >"$tmp/proj/my.toml" <<TOML
name = "rel"
[data]
path = "recs/r.safetensors"
max_tokens = 64
[[strategy]]
type = "uniform"
format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 3, 4, 8]
[metrics]
pareto = ["attn_kl_mean"]
[output]
plots = false
TOML
for i in 0 1; do
  (cd "$tmp/cwd1" && array_task "$i" 0 1 2 bash "$sweep" -n 2 ../proj/my.toml "$tmp/rel" --quiet) >"$tmp/rel$i.out" 2>&1 \
    || fail "shard $i/2 of a config with a relative data path exited $?: $(cat "$tmp/rel$i.out")"
done
(cd "$tmp/cwd2" && KVBUDGET="$kvb" bash "$src/scripts/slurm/merge.sbatch" "$tmp/rel") >"$tmp/rel_merge.out" 2>&1 \
  || fail "merge.sbatch of a config with a relative data path exited $?: $(cat "$tmp/rel_merge.out")"
expect "$tmp/rel/merged/manifest.json" '"status": "complete"' "the merge of a config with a relative data path"
rel1=$(ls -d "$tmp"/rel/shards/rel/*-shard1of2)
expect "$rel1/manifest.json" "\"config\": \"$tmp/proj/my.toml\"" "the shard's manifest (the config, absolute)"
for attempt in 1 2; do  # the resumed manifest still names the original config: a second resume finds the data too
  sed -i 1d "$rel1/results.jsonl"
  (cd "$tmp/cwd2" && "$kvb" run --resume "$rel1" --quiet) >"$tmp/rel_resume$attempt.out" 2>&1 \
    || fail "--resume of a config with a relative data path (attempt $attempt) exited $?: $(cat "$tmp/rel_resume$attempt.out")"
  expect "$rel1/manifest.json" '"points_resumed": 1' "the resumed shard (attempt $attempt)"
  expect "$rel1/manifest.json" "\"config\": \"$tmp/proj/my.toml\"" "the resumed shard's manifest (attempt $attempt)"
done
(cd "$tmp/cwd2" && "$kvb" run --resume "$tmp/cwd1" --quiet) >"$tmp/not_a_run.out" 2>&1
[ $? -eq 2 ] || fail "--resume of a folder that is not a run: expected exit 2"
expect "$tmp/not_a_run.out" "is not a kvbudget results folder" "--resume of a folder that is not a run"

exit $status
