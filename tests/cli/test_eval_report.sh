#!/usr/bin/env bash
# `kvbudget eval`'s llama.cpp-style report (issue 21 items 3 and 7): a text evaluated in
# windows of --ctx tokens with a progress bar, --json with llama.cpp's statistics, the
# exact logits kept with --kl-base and reused (a mismatched one refused), the warning
# past max_position_embeddings, and data.n_ctx in a model-level config; --out's scored
# positions and window metadata, output paths that name one file refused, GPT-2's
# position table with the --ctx that fits, and Ctrl-C/SIGTERM leaving no temporary file.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
text="$src/data/text/eval_kjv_revelation.txt"
llama="$src/data/models/llama-bytes"

# Windows, --json and a kl-base written: 1024 tokens in 4 windows of 256.
"$kvb" eval "$llama" --text "$text" --max-tokens 1024 --ctx 256 --format int4-asym-g32 --json \
  --kl-base "$tmp/base.safetensors" >"$tmp/a.json" 2>"$tmp/a.err" || fail "eval --json exited $?: $(cat "$tmp/a.err")"
[ -s "$tmp/base.safetensors" ] || fail "--kl-base: no file written"
expect "$tmp/a.err" "window 4/4 done" "eval progress (stderr, not a terminal)"
/usr/bin/python3 -c 'import json, math, sys
j = json.load(open(sys.argv[1]))
for k in ["ppl", "ppl_se", "kl_mean", "kl_mean_se", "same_top", "same_top_se", "ln_ppl_ratio", "ln_ppl_ratio_se",
          "ppl_base", "ppl_base_se", "kl_p99_9", "kl_p1", "delta_p_mean", "delta_p_mean_se", "delta_p_rms",
          "delta_p_p1", "delta_p_min", "delta_p_max", "ppl_diff", "ppl_diff_se", "ln_ppl_cor", "kl_p95",
          "kl_p0_1", "kl_min"]:
    assert isinstance(j[k], float) and math.isfinite(j[k]), (k, j.get(k))
assert abs(j["ppl_diff"] - (j["ppl"] - j["ppl_base"])) < 1e-9 * j["ppl"]
assert 0 < j["ln_ppl_cor"] <= 1 and j["kl_min"] <= j["kl_p0_1"] <= j["kl_p1"] and j["kl_p90"] <= j["kl_p95"] <= j["kl_p99"]
assert j["windows"] == 4 and j["n_ctx"] == 256 and j["tokens"] == 1024, j
assert j["positions"] == 4 * 255, j["positions"]
assert j["kl_base_reused"] is False
assert j["kl_mean"] > 0 and 0 < j["same_top"] <= 1
assert abs(j["ppl_ratio"] - math.exp(j["ln_ppl_ratio"])) < 1e-9 * j["ppl_ratio"]
assert j["metrics"]["next_token_kl_mean"] == j["kl_mean"]
' "$tmp/a.json" || fail "eval --json: a key missing or a bad value: $(head -c 600 "$tmp/a.json")"

# The kl-base reused: the same numbers, the exact logits not recomputed past the first window.
"$kvb" eval "$llama" --text "$text" --max-tokens 1024 --ctx 256 --format int4-asym-g32 --json \
  --kl-base "$tmp/base.safetensors" >"$tmp/b.json" 2>"$tmp/b.err" || fail "eval with a kl-base exited $?: $(cat "$tmp/b.err")"
/usr/bin/python3 -c 'import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert b["kl_base_reused"] is True
for k in ["ppl", "ppl_se", "ppl_base", "kl_mean", "kl_mean_se", "same_top", "delta_p_mean", "kl_max"]:
    assert a[k] == b[k], (k, a[k], b[k])
' "$tmp/a.json" "$tmp/b.json" || fail "eval with a reused kl-base gives other numbers"

# The exact logits kept in a temporary file and read a window at a time (--base-memory 0,
# issue 21): the same report and the same files, byte for byte; 1025 tokens leave a lone
# last token (a zero row); the unlinked temporary file leaves nothing in $TMPDIR.
mkdir -p "$tmp/spill"
for mode in held bounded; do
  limit=1024; [ $mode = bounded ] && limit=0
  TMPDIR="$tmp/spill" "$kvb" eval "$llama" --text "$text" --max-tokens 1025 --ctx 256 --format int4-asym-g32 --json \
    --base-memory $limit --out "$tmp/$mode.safetensors" --nll "$tmp/$mode.npy" >"$tmp/$mode.json" 2>"$tmp/$mode.err" \
    || fail "eval --base-memory $limit exited $?: $(cat "$tmp/$mode.err")"
  TMPDIR="$tmp/spill" "$kvb" eval "$llama" --text "$text" --max-tokens 1025 --ctx 256 --base-memory $limit \
    --out "$tmp/${mode}_exact.safetensors" >"$tmp/${mode}_exact.out" 2>&1 || fail "eval exact --base-memory $limit"
done
cmp -s "$tmp/held.json" "$tmp/bounded.json" || fail "--base-memory 0: another report: $(diff "$tmp/held.json" "$tmp/bounded.json" | head -5)"
for f in .safetensors .npy _exact.safetensors; do
  cmp -s "$tmp/held$f" "$tmp/bounded$f" || fail "--base-memory 0: another file (held$f, bounded$f)"
done
expect "$tmp/bounded_exact.out" "above --base-memory 0 MiB: kept in a temporary file" "eval --base-memory 0"
[ -z "$(ls -A "$tmp/spill")" ] || fail "--base-memory 0 left files in \$TMPDIR: $(ls "$tmp/spill")"
"$kvb" eval "$llama" --text "$text" --base-memory=-1 >/dev/null 2>"$tmp/bm.err"
[ $? -eq 2 ] || fail "--base-memory -1 should exit 2"
expect "$tmp/bm.err" "--base-memory must be a number of MiB >= 0" "eval --base-memory -1"

# The exact cache alone: its PPL, no comparisons.
"$kvb" eval "$llama" --text "$text" --max-tokens 300 --ctx 256 --json >"$tmp/e.json" 2>/dev/null || fail "eval --json exact"
/usr/bin/python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
assert j["plan"] == "exact" and j["ppl"] == j["ppl_base"] > 1 and j["ppl_se"] > 0, j
assert j["kl_mean"] is None and j["same_top"] is None and j["windows"] == 2 and j["positions"] == 255 + 43, j
' "$tmp/e.json" || fail "eval --json without a plan: $(head -c 400 "$tmp/e.json")"

# Text report: llama.cpp's sections.
"$kvb" eval "$llama" --text "$text" --max-tokens 512 --ctx 256 --format int4-asym-g32 >"$tmp/t.out" 2>&1 \
  || fail "eval text report exited $?: $(cat "$tmp/t.out")"
for line in "in 2 windows of 256 tokens, scoring all" "====== Perplexity statistics ======" \
  "Mean ln(PPL(Q)/PPL(base))     :" "Cor(ln(PPL(Q)), ln(PPL(base))):" "Mean PPL(Q)-PPL(base)         :" \
  "====== KL divergence statistics ======" "99.9%   KLD:" "95.0%   KLD:" " 0.1%   KLD:" "Minimum KLD:" \
  "====== Token probability statistics ======" "RMS Δp    :" "Same top p:"; do
  expect "$tmp/t.out" "$line" "eval report"
done
grep -qE "^Mean    KLD: +[0-9.]+ ± +[0-9.]+$" "$tmp/t.out" || fail "eval report: Mean KLD without ± SE"
# llama.cpp's rule: the second half of each window.
"$kvb" eval "$llama" --text "$text" --max-tokens 512 --ctx 256 --score second_half --format int4-asym-g32 --json \
  >"$tmp/h.json" 2>/dev/null || fail "eval --score second_half"
/usr/bin/python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["positions"] == 2 * 127' "$tmp/h.json" \
  || fail "--score second_half: not positions 128..254 of each window"

# A kl-base for other tokens, or other windows, is refused by name.
"$kvb" eval "$llama" --text "$text" --max-tokens 768 --ctx 256 --format int4-asym-g32 \
  --kl-base "$tmp/base.safetensors" >/dev/null 2>"$tmp/m.err"
[ $? -eq 2 ] || fail "a kl-base for other tokens should exit 2"
expect "$tmp/m.err" "base.safetensors (--kl-base, from model llama-bytes): computed on 1024 tokens, but 768 are evaluated" \
  "mismatched kl-base"
"$kvb" eval "$llama" --text "$text" --max-tokens 1024 --ctx 512 --format int4-asym-g32 \
  --kl-base "$tmp/base.safetensors" >/dev/null 2>"$tmp/c.err"
[ $? -eq 2 ] || fail "a kl-base for other windows should exit 2"
expect "$tmp/c.err" "computed in windows of n_ctx = 256, but n_ctx = 512 now" "kl-base with another --ctx"
"$kvb" eval "$src/data/models/gpt2-bytes" --text "$text" --max-tokens 1024 --ctx 256 --format int4-asym-g32 \
  --kl-base "$tmp/base.safetensors" >/dev/null 2>"$tmp/g.err"
[ $? -eq 2 ] || fail "a kl-base of another model should exit 2"
expect "$tmp/g.err" "computed by a model of another shape" "kl-base of another model"
"$kvb" eval "$llama" --text "$text" --ctx 1 >/dev/null 2>"$tmp/ctx.err"
[ $? -eq 2 ] || fail "--ctx 1 should exit 2"
expect "$tmp/ctx.err" "--ctx must be 0 (one window of every token) or >= 2, got 1" "eval --ctx 1"

# Past max_position_embeddings (2048): warned once; windows within it: no warning.
"$kvb" eval "$llama" --text "$text" --max-tokens 2050 --ctx 0 >"$tmp/w.out" 2>"$tmp/w.err" || fail "eval past 2048 exited $?"
[ "$(grep -c "2050 tokens exceed max_position_embeddings 2048" "$tmp/w.err")" -eq 1 ] \
  || fail "eval past max_position_embeddings: not warned once: $(cat "$tmp/w.err")"
"$kvb" eval "$llama" --text "$text" --max-tokens 2050 --ctx 1024 >"$tmp/nw.out" 2>"$tmp/nw.err" || fail "eval in windows exited $?"
grep -q "max_position_embeddings" "$tmp/nw.err" && fail "eval in windows of 1024 warned about positions"
"$kvb" record "$llama" --text "$text" --max-tokens 2050 --out "$tmp/r.safetensors" >/dev/null 2>"$tmp/r.err" \
  || fail "record past 2048 exited $?"
[ "$(grep -c "exceed max_position_embeddings 2048" "$tmp/r.err")" -eq 1 ] || fail "record: not warned once"

# A model-level config in windows (data.n_ctx) with llama.cpp's detailed statistics.
"$kvb" run "$src/configs/llama_ppl.toml" --out "$tmp/results" -q --set data.max_tokens=384 --set data.n_ctx=128 \
  --set data.continuations=0 --set 'metrics.report=["ppl", "ln_ppl_ratio", "delta_p_mean", "next_token_kl_p99_9"]' \
  >"$tmp/run.out" 2>"$tmp/run.err" \
  || fail "llama_ppl.toml with data.n_ctx exited $?: $(tail -5 "$tmp/run.err")"
points="$tmp/results/llama_ppl/latest/points.csv"
for c in ln_ppl_ratio ln_ppl_ratio_se delta_p_mean delta_p_mean_se next_token_kl_p99_9; do
  has_column "$points" "$c" || fail "points.csv: no column $c"
done
"$kvb" run "$src/configs/llama_ppl.toml" --out "$tmp/results" -q --set data.max_tokens=384 --set data.n_ctx=1 \
  >/dev/null 2>"$tmp/n1.err"
[ $? -eq 2 ] || fail "data.n_ctx = 1 should exit 2"
expect "$tmp/n1.err" "n_ctx" "data.n_ctx = 1"
# --out says which positions the PPL averages: `scored` [T-1] and metadata n_ctx, score;
# nll is NaN at each window's end and finite (unscored) in the first halves.
"$kvb" eval "$llama" --text "$text" --max-tokens 300 --ctx 128 --score second_half --format int4-asym-g32 --json \
  --out "$tmp/sc.safetensors" --nll "$tmp/sc.npy" >"$tmp/sc.json" 2>"$tmp/sc.err" || fail "eval --out second_half: $(cat "$tmp/sc.err")"
"$kvb" eval "$llama" --text "$text" --max-tokens 300 --ctx 128 --json --out "$tmp/sa.safetensors" >"$tmp/sa.json" \
  2>"$tmp/sa.err" || fail "eval --out exact: $(cat "$tmp/sa.err")"
/usr/bin/python3 -c 'import json, struct, sys, numpy as np
def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    kinds = {"F32": np.float32, "I32": np.int32, "I64": np.int64}
    tensors = {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], kinds[v["dtype"]])
               for k, v in header.items()}
    return tensors, meta
def close(a, b): return abs(a - b) <= 1e-5 * b
t, meta = read_safetensors(sys.argv[1])
j = json.load(open(sys.argv[2]))
assert meta["n_ctx"] == "128" and meta["score"] == "second_half", meta
scored = t["scored"].astype(bool)
assert scored.shape == (299,) and scored.sum() == j["positions"] == 63 + 63, scored.sum()
assert scored[64:127].all() and not scored[:64].any() and not scored[127] and scored[192:255].all() and scored[256:].sum() == 0
assert np.isnan(t["nll"][[127, 255]]).all() and np.isfinite(t["nll"][:127]).all()
assert close(np.exp(t["nll"][scored].mean()), j["ppl"]), (np.exp(t["nll"][scored].mean()), j["ppl"])
assert close(np.exp(t["nll_exact"][scored].mean()), j["ppl_base"])
nll = np.load(sys.argv[3])
assert np.array_equal(nll, t["nll"], equal_nan=True)
mod = np.arange(299) % 128
assert np.array_equal(scored, (mod >= 64) & np.isfinite(nll)), "--help rule for --nll users"
a, meta = read_safetensors(sys.argv[4])
ja = json.load(open(sys.argv[5]))
assert meta["n_ctx"] == "128" and meta["score"] == "all" and "nll_exact" not in a
assert np.array_equal(a["scored"].astype(bool), np.isfinite(a["nll"])) and a["scored"].sum() == ja["positions"] == 127 + 127 + 43
assert close(np.exp(a["nll"][a["scored"] == 1].mean()), ja["ppl"])
' "$tmp/sc.safetensors" "$tmp/sc.json" "$tmp/sc.npy" "$tmp/sa.safetensors" "$tmp/sa.json" \
  || fail "eval --out: scored positions or metadata do not give the reported PPL back"

# Two outputs naming one file are refused before any work (the --out would replace the kl-base).
mkdir -p "$tmp/sub"
"$kvb" eval "$llama" --text "$text" --max-tokens 300 --ctx 128 --format int4-asym-g32 --out "$tmp/same.safetensors" \
  --kl-base "$tmp/sub/../same.safetensors" >/dev/null 2>"$tmp/same.err"
[ $? -eq 2 ] || fail "--out and --kl-base naming one file should exit 2"
expect "$tmp/same.err" "--out $tmp/same.safetensors and --kl-base $tmp/sub/../same.safetensors are the same file" \
  "--out = --kl-base"
[ ! -e "$tmp/same.safetensors" ] || fail "--out = --kl-base wrote a file"
"$kvb" eval "$llama" --text "$text" --max-tokens 300 --out "$tmp/same.npy" --nll "$tmp/same.npy" >/dev/null 2>"$tmp/same2.err"
[ $? -eq 2 ] || fail "--out and --nll naming one file should exit 2"
expect "$tmp/same2.err" "are the same file" "--out = --nll"

# GPT-2's learned position table (1024): a longer window is refused with the --ctx that fits.
gpt2="$src/data/models/gpt2-bytes"
"$kvb" eval "$gpt2" --text "$text" --max-tokens 1100 --ctx 0 >/dev/null 2>"$tmp/pos.err"
[ $? -eq 2 ] || fail "gpt2 past n_positions should exit 2"
expect "$tmp/pos.err" "a window of 1100 tokens exceeds the learned position table (n_positions 1024 in config.json); evaluate in windows of at most 1024 tokens: --ctx 1024" \
  "gpt2 past n_positions"
"$kvb" eval "$gpt2" --text "$text" --max-tokens 1100 --ctx 1024 >/dev/null 2>"$tmp/pos_ok.err" \
  || fail "gpt2 in windows of 1024 exited $?: $(cat "$tmp/pos_ok.err")"

# Interrupts (a background job starts with SIGINT ignored; eval handles it anyway): the
# file being written is removed, no FILE.tmp.<pid> stays, exit 128 + signal.
# interrupt_eval NAME SIGNAL WAIT_FOR ARGS...: starts eval, waits for the temporary file
# $tmp/WAIT_FOR.tmp.<pid>, sends SIGNAL, sets rc.
interrupt_eval() {
  local name="$1" sig="$2" wait_for="$3"
  shift 3
  "$kvb" eval "$llama" --text "$text" --max-tokens 16384 --ctx 128 --format int4-asym-g32 "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err" &
  local pid=$!
  for _ in $(seq 2400); do
    ls "$tmp/$wait_for".tmp.* >/dev/null 2>&1 && break
    sleep 0.05
  done
  ls "$tmp/$wait_for".tmp.* >/dev/null 2>&1 || fail "$name: $wait_for.tmp.* never appeared"
  kill -"$sig" $pid
  wait $pid
  rc=$?
}
interrupt_eval int INT ib.safetensors --kl-base "$tmp/ib.safetensors"
[ $rc -eq 130 ] || fail "eval interrupted while writing --kl-base: expected exit 130, got $rc"
expect "$tmp/int.err" "kvbudget eval: interrupted by SIGINT; unfinished output files were removed" "eval Ctrl-C"
[ ! -e "$tmp/ib.safetensors" ] || fail "eval Ctrl-C: an unfinished --kl-base was left"
interrupt_eval term TERM to.safetensors --out "$tmp/to.safetensors" --nll "$tmp/to.npy"
[ $rc -eq 143 ] || fail "eval sent SIGTERM while writing --out: expected exit 143, got $rc"
expect "$tmp/term.err" "kvbudget eval: interrupted by SIGTERM" "eval SIGTERM"
[ ! -e "$tmp/to.safetensors" ] && [ ! -e "$tmp/to.npy" ] || fail "eval SIGTERM: an unfinished output was left"
ls "$tmp" | grep -q '\.tmp\.' && fail "interrupted eval left temporary files: $(ls "$tmp" | grep '\.tmp\.')"
# record: a hangup while the model runs ends it at once, nothing written.
"$kvb" record "$llama" --text "$text" --max-tokens 0 --out "$tmp/rh.safetensors" >/dev/null 2>"$tmp/rh.err" &
pid=$!
sleep 1
kill -HUP $pid
wait $pid
rc=$?
[ $rc -eq 129 ] || fail "record sent SIGHUP: expected exit 129, got $rc"
expect "$tmp/rh.err" "kvbudget record: interrupted by SIGHUP" "record SIGHUP"
ls "$tmp" | grep -q '^rh\.safetensors' && fail "record SIGHUP left $(ls "$tmp" | grep '^rh\.safetensors')"
exit $status
