#!/usr/bin/env bash
# Executes one notebook of notebooks/ as scripts/reproduce.sh does, so notebooks cannot rot:
# Debian's `jupyter nbconvert --execute` with /usr/bin/python3's kernel, on a copy in a
# scratch directory outside the repository, with none of the old KVB_* variables set (the
# package finds configs and data by itself), publishing into OUT_DIR instead of
# results/reproductions/. Checks that it published files and rewrote nothing in the source tree.
#   $1 = notebook name (taqg_phases), $2 = build directory, $3 = source dir, $4 = output directory
# Exit 0 pass, 1 fail, 77 skipped (no jupyter / nbconvert / ipykernel / pandas here).
set -u
name="$1"
build="$2"
src="$3"
out="$4"
rm -rf "$out/$name"
mkdir -p "$out"
# What the run must leave alone: the notebook itself and its published results in the source
# tree (only those, so that editing other files while the tests run does not fail them).
fingerprint() {
  find "$src/notebooks/$name.ipynb" "$src/results/reproductions/$name" -type f -print0 2>/dev/null | sort -z |
    xargs -0 md5sum
}
before=$(fingerprint)
start=$(date +%s)
env -u KVB_SOURCE_DIR -u KVB_REPRO_OUT -u KVB_BIN bash "$src/scripts/reproduce.sh" --build "$build" --out "$out" "$name"
rc=$?
if [ "$rc" -ne 0 ]; then
  exit "$rc"  # 77: skipped; 1: the notebook failed (reproduce.sh printed why)
fi
if [ -z "$(ls -A "$out/$name" 2>/dev/null)" ]; then
  echo "FAIL: $name published nothing into $out/$name"
  exit 1
fi
if [ "$(fingerprint)" != "$before" ]; then
  echo "FAIL: executing $name changed files in the source tree:"
  diff <(echo "$before") <(fingerprint)
  exit 1
fi
echo "executed $name from a copy outside the repository in $(($(date +%s) - start)) s; published: $(ls "$out/$name" | tr '\n' ' ')"
exit 0
