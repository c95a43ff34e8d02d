#!/usr/bin/env bash
# Executes one notebook of notebooks/ through Debian's `jupyter nbconvert --execute`
# with /usr/bin/python3's ipykernel, so notebooks cannot rot. The executed copy and the
# files it publishes go to OUT_DIR (never into the source tree).
#   $1 = notebook, $2 = kvbudget binary, $3 = source dir, $4 = output directory
# Exit 0 pass, 1 fail, 77 skipped (no jupyter / nbconvert / ipykernel here).
set -u
nb="$1"
kvb="$2"
src="$3"
out="$4"
jupyter=/usr/bin/jupyter
if [ ! -x "$jupyter" ] || ! /usr/bin/python3 -c 'import nbconvert, ipykernel, matplotlib, numpy' 2>/dev/null; then
  echo "SKIP: Debian's jupyter, nbconvert, ipykernel, matplotlib or numpy missing (scripts/setup.sh installs them)"
  exit 77
fi
rm -rf "$out"
mkdir -p "$out"
export KVB_BIN="$kvb" KVB_SOURCE_DIR="$src" KVB_REPRO_OUT="$out/published" PYDEVD_DISABLE_FILE_VALIDATION=1
start=$(date +%s)
if ! "$jupyter" nbconvert --to notebook --execute --ExecutePreprocessor.kernel_name=python3 \
    --ExecutePreprocessor.timeout=300 --output-dir "$out" "$nb" >"$out/nbconvert.log" 2>&1; then
  echo "FAIL: $nb did not execute cleanly:"
  grep -v -e 'Debugger warning' -e 'frozen modules' -e 'make the debugger' -e 'to python to disable' \
    "$out/nbconvert.log" | tail -40
  exit 1
fi
echo "executed $(basename "$nb") in $(($(date +%s) - start)) s; published files in $out/published"
exit 0
