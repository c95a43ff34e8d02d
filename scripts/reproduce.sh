#!/usr/bin/env bash
# Regenerates the published results (results/reproductions/): executes the notebooks
# (notebooks/*.ipynb) through Debian's `jupyter nbconvert --execute` with /usr/bin/python3's
# kernel in a scratch copy outside the repository, copies what each publishes
# (published/<name>/ beside the copy) to results/reproductions/<name>/ (replacing that
# folder), and makes the bounds reports. The notebooks in notebooks/ are rewritten (with
# their new outputs) only with --inplace.
#
#   scripts/reproduce.sh                          # every notebook, then the bounds reports
#   scripts/reproduce.sh taqg_phases entropy_sinks  # these notebooks only
#   scripts/reproduce.sh --inplace taqg_phases    # ... and rewrite notebooks/taqg_phases.ipynb
#   scripts/reproduce.sh bounds                   # the bounds reports only
#
# Options: --inplace; --build DIR (the build with kvbudget and build/python, default build);
# --out DIR (publish there instead of results/reproductions, e.g. for a test); --keep (keep
# the scratch copy, which a failure always keeps). Needs a build (scripts/setup.sh).
# A failing notebook publishes nothing, leaves its folder under results/reproductions/ as it
# was, and makes the script exit 1 after the others ran. Exit 77: jupyter missing.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build="$src/build"
out="$src/results/reproductions"
inplace=0
keep=0
targets=()
while (($#)); do
  case "$1" in
    --inplace) inplace=1 ;;
    --keep) keep=1 ;;
    --build) build="$2"; shift ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "reproduce.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) targets+=("$(basename "$1" .ipynb)") ;;
  esac
  shift
done
build=$(cd "$build" 2>/dev/null && pwd) || { echo "reproduce.sh: no build directory '$build' (run scripts/setup.sh)" >&2; exit 2; }
if ((${#targets[@]} == 0)); then
  for nb in "$src"/notebooks/*.ipynb; do targets+=("$(basename "$nb" .ipynb)"); done
  targets+=(bounds)
fi
for t in "${targets[@]}"; do
  if [ "$t" != bounds ] && [ ! -f "$src/notebooks/$t.ipynb" ]; then
    echo "reproduce.sh: no notebook notebooks/$t.ipynb (have: $(cd "$src/notebooks" && ls ./*.ipynb | sed 's|./||; s|\.ipynb||' | tr '\n' ' ')and bounds)" >&2
    exit 2
  fi
done

jupyter=/usr/bin/jupyter
if [[ " ${targets[*]} " != " bounds " ]]; then
  if [ ! -x "$jupyter" ] || ! /usr/bin/python3 -c 'import nbconvert, ipykernel, matplotlib, numpy, pandas' 2>/dev/null; then
    echo "reproduce.sh: Debian's jupyter, nbconvert, ipykernel, matplotlib, numpy or pandas missing (scripts/setup.sh installs them)" >&2
    exit 77
  fi
  if [ ! -f "$build/python/kvbudget/__init__.py" ]; then
    echo "reproduce.sh: $build/python has no kvbudget package (pybind11 missing at configure time? see scripts/setup.sh)" >&2
    exit 2
  fi
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvb-reproduce.XXXXXX")
mkdir -p "$out"
out=$(cd "$out" && pwd)
failed=()
for t in "${targets[@]}"; do
  start=$(date +%s)
  if [ "$t" = bounds ]; then
    if "$build/kvbudget" bounds --out "$scratch/bounds" >"$scratch/bounds.log" 2>&1 &&
       "$build/kvbudget" bounds --data "$src/configs/repro_entropy_gpt2.toml" --out "$scratch/bounds_gpt2" \
         >>"$scratch/bounds.log" 2>&1; then
      for b in bounds bounds_gpt2; do
        mkdir -p "$out/$b" && cp "$scratch/$b"/bounds/latest/bounds.{csv,md} "$out/$b/"
      done
      echo "reproduce.sh: bounds, bounds_gpt2 -> $out ($(($(date +%s) - start)) s)"
    else
      echo "reproduce.sh: FAILED: kvbudget bounds (log: $scratch/bounds.log):" >&2
      tail -20 "$scratch/bounds.log" >&2
      failed+=(bounds)
    fi
    continue
  fi
  # The copy runs from its own folder, outside the repository: only the package (on
  # PYTHONPATH, or installed by scripts/setup.sh) tells it where configs and data are.
  dir="$scratch/$t"
  mkdir -p "$dir"
  cp "$src/notebooks/$t.ipynb" "$dir/"
  if (cd "$dir" && PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" PYDEVD_DISABLE_FILE_VALIDATION=1 MPLBACKEND=Agg \
        "$jupyter" nbconvert --to notebook --execute --inplace --ExecutePreprocessor.kernel_name=python3 \
        --ExecutePreprocessor.timeout=1800 "$t.ipynb" >nbconvert.log 2>&1); then
    if [ ! -d "$dir/published/$t" ]; then
      echo "reproduce.sh: FAILED: $t ran but published nothing ($dir/published/$t missing)" >&2
      failed+=("$t")
      continue
    fi
    rm -rf "$out/$t.new" && cp -r "$dir/published/$t" "$out/$t.new" && rm -rf "$out/$t" && mv "$out/$t.new" "$out/$t"
    if ((inplace)); then cp "$dir/$t.ipynb" "$src/notebooks/$t.ipynb"; fi
    echo "reproduce.sh: $t -> $out/$t ($(ls "$out/$t" | wc -l) files, $(($(date +%s) - start)) s)$( ((inplace)) && echo "; notebooks/$t.ipynb rewritten")"
  else
    echo "reproduce.sh: FAILED: $t did not execute cleanly (executed copy and log: $dir):" >&2
    grep -v -e 'Debugger warning' -e 'frozen modules' -e 'make the debugger' -e 'to python to disable' \
      "$dir/nbconvert.log" | tail -40 >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "reproduce.sh: ${#failed[@]} failed: ${failed[*]}; their results were left as they were; scratch kept: $scratch" >&2
  exit 1
fi
if ((keep)); then echo "reproduce.sh: scratch kept: $scratch"; else rm -rf "$scratch"; fi
exit 0
