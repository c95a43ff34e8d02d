#!/usr/bin/env bash
# Sweeps beyond one machine: `kvbudget run --shard`, `merge`, `run --resume` and
# `status`, through the user-facing scripts in scripts/slurm/, on a real single-node
# Slurm cluster started here (Debian's slurm-wlm and munge: slurmctld, slurmd and
# munged as root, configured and keyed in the scratch directory, stopped at the end;
# nothing under /etc is read or written).
#   1. A single run of the (small) quickstart: the reference.
#   2. The shards of a job array with the variables Slurm sets (sweep.sbatch run by
#      hand): one shard is killed with SIGKILL midway, `status` calls it stale, its
#      task runs again and resumes it (finished points kept), merge.sbatch merges:
#      identical to the single run (timing columns aside). Merge refusals.
#   3. scripts/slurm/submit.sh on the Slurm cluster: a job array of 4 shards and a
#      dependent merge job: identical to the single run.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail, 77 when Slurm cannot
# run here (parts 1 and 2 still ran and passed; the reason is printed).
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

cfg="$src/configs/quickstart.toml"
# 2 modes x 2 groups x 4 widths = 16 points, every one with its attribution.
small=(--set 'strategy.0.vars.bits=[2, 3, 4, 8]' --quiet)
export KVB_HEARTBEAT_SECONDS=1

# same_results A B WHAT: two results folders hold the same results: points.csv
# (timing aside), pareto.csv, budgets.json, attribution, the plots' PNGs.
same_results() {
  diff <(numbers "$1/points.csv") <(numbers "$2/points.csv") >/dev/null || fail "$3: points.csv differs"
  for f in pareto.csv budgets.json attribution.csv concentration.csv; do
    [ -s "$2/$f" ] || fail "$3: no $f"
    cmp -s "$1/$f" "$2/$f" || fail "$3: $f differs"
  done
  [ ! -e "$2/errors.csv" ] || fail "$3: errors.csv written"
  if [ -d "$1/plots" ]; then
    for png in "$1"/plots/*.png; do
      cmp -s "$png" "$2/plots/$(basename "$png")" || fail "$3: plot $(basename "$png") differs"
    done
  fi
}

# 1. The reference: one run of the whole sweep.
"$kvb" run "$cfg" "${small[@]}" --out "$tmp/single" >"$tmp/single.out" 2>&1 || fail "single run exited $?"
single=$(ls -d "$tmp"/single/quickstart/2*)
[ "$(wc -l <"$single/points.csv")" -eq 17 ] || fail "expected 16 points + header in points.csv"
[ "$(wc -l <"$single/results.jsonl")" -eq 16 ] || fail "expected 16 lines in results.jsonl"
expect "$single/manifest.json" '"config_hash"' "manifest"
expect "$single/manifest.json" '"data_identity"' "manifest"
"$kvb" status "$single" >"$tmp/status_single.out" 2>&1 || fail "status exited $?"
expect "$tmp/status_single.out" "status: complete" "status of a finished run"
expect "$tmp/status_single.out" "points: 16 of 16 done" "status of a finished run"

# --shard auto outside a job array is an error that says so.
env -u SLURM_ARRAY_TASK_ID "$kvb" run "$cfg" "${small[@]}" --shard auto --out "$tmp/x" >"$tmp/auto.out" 2>&1
[ $? -eq 2 ] || fail "--shard auto outside a job array: expected exit 2"
expect "$tmp/auto.out" "not inside a Slurm job array" "--shard auto outside an array"
"$kvb" run "$cfg" "${small[@]}" --shard 4/4 --out "$tmp/x" >"$tmp/bad_shard.out" 2>&1
[ $? -eq 2 ] || fail "--shard 4/4: expected exit 2"
expect "$tmp/bad_shard.out" "below the count" "--shard 4/4"

# 2. The job array's path without Slurm: sweep.sbatch with the variables an array task
# gets. Shard 1 runs on one thread and is killed (SIGKILL) once it has finished a point.
array_env() { env SLURM_ARRAY_TASK_ID="$1" SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_MAX=3 SLURM_ARRAY_TASK_COUNT=4 \
  KVBUDGET="$kvb" "${@:2}"; }
out="$tmp/env"
for i in 0 2 3; do
  array_env "$i" bash "$src/scripts/slurm/sweep.sbatch" -n 4 "$cfg" "$out" "${small[@]}" >"$tmp/env_$i.out" 2>&1 \
    || { fail "shard $i exited $?"; cat "$tmp/env_$i.out" >&2; }
done
# (A simple command, so that $! is the process: env and sweep.sbatch exec kvbudget.)
env SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_MAX=3 SLURM_ARRAY_TASK_COUNT=4 SLURM_CPUS_PER_TASK=1 \
  KVBUDGET="$kvb" bash "$src/scripts/slurm/sweep.sbatch" -n 4 "$cfg" "$out" "${small[@]}" >"$tmp/env_1.out" 2>&1 &
victim=$!
killed=""
for _ in $(seq 1 6000); do  # up to a minute
  log=$(ls "$out"/shards/quickstart/*-shard1of4/results.jsonl 2>/dev/null || true)
  if [ -n "$log" ] && [ "$(wc -l <"$log")" -ge 1 ]; then
    # Frozen at once (a point takes milliseconds): alive, but no further point finishes
    # while status and --resume look at it; then killed without a chance to write.
    kill -STOP "$victim"
    shard1=$(dirname "$log")
    "$kvb" status "$shard1" >"$tmp/status_alive.out" 2>&1
    "$kvb" run --resume "$shard1" --quiet >"$tmp/resume_alive.out" 2>&1
    echo "exit $?" >>"$tmp/resume_alive.out"
    kill -9 "$victim" && killed=yes
    break
  fi
  kill -0 "$victim" 2>/dev/null || break
  sleep 0.01
done
wait "$victim" 2>/dev/null
if [ -z "$killed" ]; then
  fail "shard 1 finished or failed before it could be killed midway"
  cat "$tmp/env_1.out" >&2
else
  expect "$tmp/status_alive.out" "(alive: process $victim on" "status of the running shard"
  expect "$tmp/resume_alive.out" "the run is still going: process $victim on" "--resume of a running shard"
  expect "$tmp/resume_alive.out" "exit 2" "--resume of a running shard"
  expect "$shard1/manifest.json" '"status": "running"' "the killed shard's manifest"
  done_before=$(wc -l <"$shard1/results.jsonl")
  [ "$done_before" -lt 4 ] || fail "shard 1 finished all its points before the kill"
  "$kvb" status "$shard1" >"$tmp/status_stale.out" 2>&1 || fail "status exited $?"
  expect "$tmp/status_stale.out" "stale: process $victim on" "status of the killed shard"
  expect "$tmp/status_stale.out" "is gone" "status of the killed shard"
  expect "$tmp/status_stale.out" "shard 1/4 of a 16-point sweep" "status of the killed shard"
  # A merge now lists the killed shard's missing points and writes nothing.
  "$kvb" merge "$out"/shards/quickstart/*-shard* --out "$tmp/too_early" >"$tmp/merge_early.out" 2>&1
  [ $? -eq 1 ] || fail "merging with an unfinished shard: expected exit 1"
  expect "$tmp/merge_early.out" "point(s) in no folder" "merge with an unfinished shard"
  [ ! -e "$tmp/too_early" ] || fail "a refused merge wrote its folder"
  # The task runs again (a requeue): sweep.sbatch finds the folder and resumes it.
  array_env 1 bash "$src/scripts/slurm/sweep.sbatch" -n 4 "$cfg" "$out" "${small[@]}" >"$tmp/env_1b.out" 2>&1 \
    || { fail "resumed shard 1 exited $?"; cat "$tmp/env_1b.out" >&2; }
  expect "$tmp/env_1b.out" "resuming $shard1" "the requeued task"
  expect "$shard1/manifest.json" '"status": "complete"' "the resumed shard's manifest"
  expect "$shard1/manifest.json" "\"points_resumed\": $done_before" "the resumed shard's manifest"
  [ "$(ls -d "$out"/shards/quickstart/*-shard1of4 | wc -l)" -eq 1 ] || fail "the resume made a new folder"
  KVBUDGET="$kvb" bash "$src/scripts/slurm/merge.sbatch" "$out" >"$tmp/env_merge.out" 2>&1 \
    || { fail "merge.sbatch exited $?"; cat "$tmp/env_merge.out" >&2; }
  same_results "$single" "$out/merged" "shards with a killed and resumed one, merged"
  expect "$out/merged/manifest.json" '"status": "complete"' "the merged manifest"
  expect "$out/merged/manifest.json" '"merged_from"' "the merged manifest"
  # The shards partition the sweep: 4 points each here (equal costs).
  for f in "$out"/shards/quickstart/*-shard*; do
    [ "$(wc -l <"$f/points.csv")" -eq 5 ] || fail "$f: expected 4 points"
  done
fi

# Merge refusals: a shard twice, a shard of another seed; nothing is written.
s0=$(ls -d "$out"/shards/quickstart/*-shard0of4)
s3=$(ls -d "$out"/shards/quickstart/*-shard3of4)
"$kvb" merge "$out"/shards/quickstart/*-shard* "$s0" --out "$tmp/dup" >"$tmp/merge_dup.out" 2>&1
[ $? -eq 1 ] || fail "merging a shard twice: expected exit 1"
expect "$tmp/merge_dup.out" "4 point(s) in more than one folder" "merge of a shard twice"
"$kvb" run "$cfg" "${small[@]}" --set seed=1 --shard 3/4 --out "$tmp/seed1" >/dev/null 2>&1 || fail "seed 1 shard exited $?"
"$kvb" merge "$s0" "$(ls -d "$tmp"/seed1/quickstart/*-shard3of4)" --out "$tmp/mixed" >"$tmp/merge_mixed.out" 2>&1
[ $? -eq 1 ] || fail "merging shards of different seeds: expected exit 1"
expect "$tmp/merge_mixed.out" "config_hash differs" "merge of different configs"
expect "$tmp/merge_mixed.out" "seed differs (different seeds): 1 in" "merge of different seeds"
expect "$tmp/merge_mixed.out" "the configs differ in seed (0 there, 1 now)" "merge of different configs names the key"
[ ! -e "$tmp/dup" ] && [ ! -e "$tmp/mixed" ] || fail "a refused merge wrote its folder"
# --resume of a finished shard, CONFIG left out (its config.toml): nothing to run, the same results.
cp -r "$s3" "$tmp/s3_copy"
"$kvb" run --resume "$s3" --quiet >"$tmp/resume_done.out" 2>&1 || fail "resuming a finished shard exited $?"
expect "$s3/manifest.json" '"points_resumed": 4' "a finished shard resumed"
expect "$s3/manifest.json" '"status": "complete"' "a finished shard resumed"
same_results "$tmp/s3_copy" "$s3" "a finished shard resumed"
# --resume checks that it continues the same sweep.
"$kvb" run "$cfg" "${small[@]}" --set seed=1 --resume "$s3" >"$tmp/resume_other.out" 2>&1
[ $? -eq 2 ] || fail "resuming with another config: expected exit 2"
expect "$tmp/resume_other.out" "not the same sweep" "--resume with another config"
expect "$tmp/resume_other.out" "--backend: seed (0 there, 1 now))" "--resume with another config names the key"

# 3. A real Slurm cluster on this machine.
slurm_why=""
slurm_dir="$tmp/slurm"
# Stops the daemons this test started (by the ids in their pid files): scontrol
# shutdown stops slurmctld and slurmd, munged gets SIGTERM; each is waited for.
stop_slurm() {
  [ -d "$slurm_dir" ] || return 0
  [ -s "$slurm_dir/slurmctld.pid" ] && SLURM_CONF="$slurm_dir/slurm.conf" scontrol shutdown >/dev/null 2>&1
  for daemon in slurmd slurmctld munged; do
    [ -s "$slurm_dir/$daemon.pid" ] || continue
    pid=$(cat "$slurm_dir/$daemon.pid")
    [ "$daemon" = munged ] && kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { kill "$pid"; sleep 0.5; kill -9 "$pid" 2>/dev/null; }
  done
  return 0
}
trap 'stop_slurm; rm -rf "$tmp"' EXIT
trap 'exit 143' TERM INT  # a CTest timeout or Ctrl-C still stops the daemons
start_slurm() {
  [ "$(id -u)" -eq 0 ] || { slurm_why="not root (slurmd runs the jobs as root here)"; return 1; }
  for b in mungekey munged slurmctld slurmd sbatch squeue scontrol sinfo; do
    command -v "$b" >/dev/null || { slurm_why="$b is not installed (scripts/setup.sh installs slurm-wlm and munge)"; return 1; }
  done
  mkdir -p "$slurm_dir/state" "$slurm_dir/spool"
  mungekey -c -k "$slurm_dir/munge.key" && chmod 400 "$slurm_dir/munge.key" \
    || { slurm_why="mungekey could not create a key"; return 1; }
  munged -f --socket="$slurm_dir/munge.sock" --key-file="$slurm_dir/munge.key" --pid-file="$slurm_dir/munged.pid" \
    --log-file="$slurm_dir/munged.log" --seed-file="$slurm_dir/munged.seed" \
    || { slurm_why="munged did not start: $(tail -n 3 "$slurm_dir/munged.log" 2>/dev/null)"; return 1; }
  read -r ctld_port slurmd_port < <(/usr/bin/python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
  node=$(hostname -s)
  cat >"$slurm_dir/slurm.conf" <<CONF
ClusterName=kvbtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$slurm_dir/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$slurm_dir/state
SlurmdSpoolDir=$slurm_dir/spool
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmdPidFile=$slurm_dir/slurmd.pid
SlurmctldLogFile=$slurm_dir/slurmctld.log
SlurmdLogFile=$slurm_dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=kvbtest Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF="$slurm_dir/slurm.conf"
  slurmctld -i || { slurm_why="slurmctld did not start: $(tail -n 5 "$slurm_dir/slurmctld.log" 2>/dev/null)"; return 1; }
  slurmd || { slurm_why="slurmd did not start: $(tail -n 5 "$slurm_dir/slurmd.log" 2>/dev/null)"; return 1; }
  for _ in $(seq 1 100); do
    [ "$(sinfo -h -o %t 2>/dev/null)" = "idle" ] && return 0
    sleep 0.2
  done
  slurm_why="the node did not come up idle in 20 s: $(sinfo 2>&1 | tail -n 2); $(tail -n 5 "$slurm_dir/slurmd.log" 2>/dev/null)"
  return 1
}

if ! start_slurm; then
  echo "SKIP (Slurm part): $slurm_why" >&2
  [ "$status" -eq 0 ] && exit 77
  exit "$status"
fi
sout="$tmp/cluster"
read -r array_job merge_job < <(KVBUDGET="$kvb" "$src/scripts/slurm/submit.sh" -n 4 "$cfg" "$sout" "${small[@]}")
[ -n "$merge_job" ] || fail "submit.sh did not print the job ids"
for _ in $(seq 1 600); do  # up to 120 s
  [ -z "$(squeue -h -j "$array_job,$merge_job" 2>/dev/null)" ] && break
  sleep 0.2
done
[ -z "$(squeue -h -j "$array_job,$merge_job" 2>/dev/null)" ] || fail "the Slurm jobs did not finish in 120 s"
scontrol show job "$merge_job" >"$tmp/merge_job.txt" 2>&1
expect "$tmp/merge_job.txt" "JobState=COMPLETED" "the merge job"
for i in 0 1 2 3; do
  scontrol show job "${array_job}_$i" >"$tmp/array_$i.txt" 2>&1
  expect "$tmp/array_$i.txt" "JobState=COMPLETED" "array task $i"
  expect "$sout"/logs/sweep-"${array_job}_$i".out "shard $i/4 on" "array task $i's log"
done
[ "$(ls -d "$sout"/shards/quickstart/*-shard*of4 | wc -l)" -eq 4 ] || fail "expected 4 shard folders"
same_results "$single" "$sout/merged" "the Slurm job array, merged"
if [ "$status" -ne 0 ]; then
  for f in "$sout"/logs/*; do echo "== $f" >&2; tail -n 20 "$f" >&2; done
  tail -n 20 "$slurm_dir/slurmctld.log" >&2
fi
exit $status
