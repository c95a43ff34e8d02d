#!/usr/bin/env bash
# Plots fit for a paper (README "Plots"): the strategies' names label every output
# (points.csv, pareto.csv, budgets.json, the console, the plots); every plot is written
# as PNG, SVG with text elements and PDF with TrueType fonts (editable text); the y axis names the
# metric's quantity, unit and direction from the metric table; overlapping points are
# annotated; the caption file lists the infeasible point; the attribution pages cover
# every point; log axes get two labelled ticks; the plot interpreter is found or named;
# both scripts run, side by side, and each failure is reported with its log.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || { echo "SKIP: Debian's python3-matplotlib is missing"; exit 77; }
rec="$src/data/records/gpt2-bytes-record.safetensors"

# Named blocks: flat int2..8 at groups 32 and 64 (14 points), `same` = flat's int4-g32
# point again (it overlaps it on every plot). (An infeasible budget is refused before the
# sweep, so the caption's list of failed points is left to points that fail while measured.)
cat >"$tmp/named.toml" <<TOML
name = "named"
[data]
path = "$rec"
max_tokens = 64
[[strategy]]
name = "flat"
type = "uniform"
format = "int{bits}-asym-g{group}"
[strategy.vars]
bits = "2..8"
group = [32, 64]
[[strategy]]
name = "same"
type = "uniform"
format = "int4-asym-g32"
[metrics]
pareto = ["attn_kl_mean", "topk_overlap"]
[budgets]
queries = ["attn_kl_mean <= 1e-2"]
TOML
"$kvb" run "$tmp/named.toml" --out "$tmp/r1" --quiet >"$tmp/r1.out" 2>&1
[ $? -eq 0 ] || fail "the named run exited non-zero: $(cat "$tmp/r1.out")"
d=$(ls -d "$tmp"/r1/named/2*)

# 1. Names, not keys, label the points when given.
/usr/bin/python3 - "$d" <<'PY' || fail "points.csv / pareto.csv / budgets.json / do not carry the names"
import csv, json, os, sys
d = sys.argv[1]
points = list(csv.DictReader(open(os.path.join(d, "points.csv"))))
assert {p["strategy"] for p in points} == {"flat", "same"}, {p["strategy"] for p in points}
labels = {p["label"] for p in points}
assert "flat(bits=4, group=32)" in labels and "same" in labels, labels
pareto = list(csv.DictReader(open(os.path.join(d, "pareto.csv"))))
assert pareto and all(r["strategy"] in ("flat", "same") and r["label"].startswith(r["strategy"]) for r in pareto), pareto
# Each frontier point's interval, and whether a point with no more memory cannot be told from it.
assert all(float(r["value_lo"]) <= float(r["value"]) <= float(r["value_hi"]) for r in pareto), pareto
assert all(r["within_uncertainty"] in ("true", "false") for r in pareto), pareto
ids = {p["id"] for p in points}
for r in pareto:
    rivals = [i for i in r["may_be_dominated_by"].split(";") if i]
    assert (r["within_uncertainty"] == "true") == bool(rivals) and set(rivals) <= ids, r
answer = json.load(open(os.path.join(d, "budgets.json")))[0]["answers"][0]
assert answer["strategy"] in ("flat", "same") and answer["label"].startswith(answer["strategy"]), answer
# The answer's uncertainty: its interval, whether all of it meets the bound, cheaper candidates.
lo, hi = answer["interval"]
assert lo <= answer["value"] <= hi, answer
assert isinstance(answer["meets_bound_for_certain"], bool), answer
assert (hi <= 1e-2) == answer["meets_bound_for_certain"], answer
assert all(c["bpe"] < answer["bpe"] and c["interval"][0] <= 1e-2 for c in answer["cheaper_within_uncertainty"]), answer
PY
grep -F '  flat(bits=' "$tmp/r1.out" >/dev/null || fail "the console's frontier does not name points by their strategy's name"
grep -F 'uniform(format=' "$tmp/r1.out" && fail "the console names a named point by its key"
expect "$tmp/r1.out" "attn_kl_mean <= 1e-2 -> least memory: flat(bits=" "console budget answer"

# 2. Every plot in three formats; SVG text is text, PDF fonts are TrueType.
for m in attn_kl_mean topk_overlap; do
  for ext in png svg pdf; do [ -s "$d/plots/$m.$ext" ] || fail "plots/$m.$ext missing"; done
  [ -s "$d/plots/$m.caption.txt" ] || fail "plots/$m.caption.txt missing"
  grep -q '<text' "$d/plots/$m.svg" || fail "plots/$m.svg has no text elements"
  # pdf.fonttype 42: TrueType font programs (FontFile2), no Type 3 glyph procedures.
  grep -aq '/FontFile2' "$d/plots/$m.pdf" && ! grep -aq '/Subtype /Type3' "$d/plots/$m.pdf" \
    || fail "plots/$m.pdf does not embed its fonts as TrueType (pdf.fonttype 42)"
done
expect "$d/plots/attn_kl_mean.svg" "attention KL, mean (nats, lower is better)" "y axis label (metric table)"
expect "$d/plots/topk_overlap.svg" "top-k attention overlap, fraction of k (higher is better)" "y axis label"
expect "$d/plots/attn_kl_mean.svg" "bits per element at the recorded context" "x axis label"
expect "$d/plots/attn_kl_mean.svg" ">flat<" "legend (the strategy's name)"
grep -q 'strategy=flat' "$d/plots/attn_kl_mean.svg" && fail "the legend says strategy=flat"
# flat(bits=4, group=32) and same are one point twice: annotated on the figure, named in the caption.
expect "$d/plots/attn_kl_mean.svg" "flat: bits=4, group=32" "overlap annotation"
expect "$d/plots/attn_kl_mean.caption.txt" "Overlapping, annotated: flat(bits=4, group=32)" "caption (overlap)"

# 3. Attribution: 15 points, 12 a page: two pages that together name every point.
for name in concentration attribution_layers; do
  for ext in png svg pdf; do
    [ -s "$d/plots/$name.$ext" ] && [ -s "$d/plots/$name-p2.$ext" ] || fail "plots/$name(-p2).$ext missing"
  done
done
[ -e "$d/plots/attribution_layers-p3.png" ] && fail "a third page for 15 points"
/usr/bin/python3 - "$d" <<'PY' || fail "the attribution pages do not cover every point exactly once"
import csv, os, re, sys
d = sys.argv[1]
ids = sorted({r["id"] for r in csv.DictReader(open(os.path.join(d, "attribution.csv")))}, key=int)
caption = open(os.path.join(d, "plots", "attribution.caption.txt")).read()
pages = re.findall(r"^page \d+: (.*)$", caption, re.M)
on_pages = [m for page in pages for m in re.findall(r"point (\d+) ", page)]
assert len(ids) == 15 and on_pages == ids, (ids, on_pages)
labels = {p["id"]: p["label"] for p in csv.DictReader(open(os.path.join(d, "points.csv")))}
svgs = open(os.path.join(d, "plots", "attribution_layers.svg")).read() + \
    open(os.path.join(d, "plots", "attribution_layers-p2.svg")).read()
missing = [labels[i] for i in ids if labels[i] not in svgs]
assert not missing, missing
PY

# 4. Log axes get at least two labelled ticks, however narrow their span.
/usr/bin/python3 -B - "$src/experiments" <<'PY' || fail "a log axis with fewer than two labelled ticks"
import sys
sys.path.insert(0, sys.argv[1])
import plot_style
from plot_style import plt
for low, high in [(2e-3, 9e-3), (1.1e-4, 1.9e-4), (3e-5, 0.2), (0.5, 0.51)]:
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.plot([0, 1], [low, high])
    ax.set_ylim(low, high)
    plot_style.log_ticks(ax.yaxis, low, high)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [t for t in ax.get_yticklabels() if t.get_text() and lo * 0.999 <= t.get_position()[1] <= hi * 1.001]
    assert len(shown) >= 2, (low, high, [t.get_text() for t in ax.get_yticklabels()])
    plt.close(fig)
PY

# 5. The interpreter: one without matplotlib is named with what to install, the results
# are kept; the scripts themselves say what they need.
printf '#!/bin/sh\nexit 1\n' >"$tmp/nompl-python3" && chmod +x "$tmp/nompl-python3"
KVB_PYTHON="$tmp/nompl-python3" "$kvb" run "$tmp/named.toml" --out "$tmp/r2" --quiet >"$tmp/r2.out" 2>&1
[ $? -eq 1 ] || fail "plots impossible: expected exit 1"
expect "$tmp/r2.out" "plots need a Python 3 with matplotlib and numpy; tried \$KVB_PYTHON $tmp/nompl-python3 (cannot import matplotlib and numpy)" "no interpreter"
expect "$tmp/r2.out" "python3-matplotlib" "no interpreter (what to install)"
[ -s "$(ls -d "$tmp"/r2/named/2*)/points.csv" ] || fail "points.csv lost when the plots cannot be drawn"
/usr/bin/python3 -S "$src/experiments/plot_pareto.py" --results "$d" --metrics attn_kl_mean >"$tmp/S.out" 2>&1 \
  && fail "plot_pareto.py without matplotlib exited 0"
expect "$tmp/S.out" "cannot import matplotlib; the plot scripts need matplotlib and numpy" "plot script without matplotlib"

# 6. Both scripts run (side by side) and each failure is reported with its log; the
# scripts' BLAS runs on one thread unless the environment says otherwise.
cat >"$tmp/broken-python3" <<'SH'
#!/bin/sh
[ "$1" = -c ] && exit 0
echo "broken $(basename "$1"), OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS"
exit 3
SH
chmod +x "$tmp/broken-python3"
KVB_PYTHON="$tmp/broken-python3" "$kvb" run "$tmp/named.toml" --out "$tmp/r3" --quiet >"$tmp/r3.out" 2>&1
[ $? -eq 1 ] || fail "plot scripts failing: expected exit 1"
expect "$tmp/r3.out" "broken plot_pareto.py, OPENBLAS_NUM_THREADS=1" "the pareto script's failure"
expect "$tmp/r3.out" "broken plot_attribution.py, OPENBLAS_NUM_THREADS=1" "the attribution script's failure"
r3="$(ls -d "$tmp"/r3/named/2*)"
[ -s "$r3/plots.log" ] && [ -s "$r3/plots_attribution.log" ] || fail "a failed plot script's log was not kept"
[ -s "$r3/points.csv" ] || fail "points.csv lost when the plot scripts fail"
OPENBLAS_NUM_THREADS=2 KVB_PYTHON="$tmp/broken-python3" "$kvb" run "$tmp/named.toml" --out "$tmp/r4" --quiet \
  >"$tmp/r4.out" 2>&1
expect "$tmp/r4.out" "broken plot_pareto.py, OPENBLAS_NUM_THREADS=2" "the caller's OPENBLAS_NUM_THREADS kept"
exit $status
