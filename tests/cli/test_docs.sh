#!/usr/bin/env bash
# The docs' lists of which format families have a CUDA twin agree with the format table
# (`kvbudget formats` marks every example that has one `[cuda]`): kernels/README.md's
# "Families with a twin" table and "No twin yet" paragraph, and configs/README.md's
# sentence naming the families that "have none yet". A twin added or a family added
# without updating them fails here.
source "$(dirname "$0")/lib.sh"
kvb="$1"; src="$2"

"$kvb" formats >"$tmp/formats.txt" || { echo "FAIL: kvbudget formats exited non-zero" >&2; exit 1; }

/usr/bin/python3 - "$tmp/formats.txt" "$src/kernels/README.md" "$src/configs/README.md" <<'EOF' || status=1
import re, sys

formats_txt, kernels_readme, configs_readme = (open(p).read() for p in sys.argv[1:])

# Family header lines are "name: description"; example lines are indented and end in
# "bpe" or "bpe  [cuda]". Presets follow the families and are not examples.
family, examples = None, {}
for line in formats_txt.splitlines():
    header = re.match(r"^([a-z0-9_]+): ", line)
    if header:
        family = header.group(1)
        examples[family] = []
    elif family and re.match(r"^\s+\S+\s+[0-9.]+ bpe", line):
        examples[family].append(line.rstrip().endswith("[cuda]"))
    elif line and not line.startswith(" "):
        family = None
examples = {f: e for f, e in examples.items() if e}
mixed = [f for f, e in examples.items() if any(e) and not all(e)]
with_twin = {f for f, e in examples.items() if all(e)}
without_twin = {f for f, e in examples.items() if not any(e)}

failures = []
if len(examples) < 5:
    failures.append(f"only {len(examples)} families parsed from `kvbudget formats`")
if mixed:
    failures.append(f"families with and without [cuda] examples: {mixed} (the docs list whole families)")

def words(text):
    return set(re.findall(r"[a-z0-9_]+", text))

# kernels/README.md: the table's first column, and the paragraph after "No twin yet".
table = re.search(r"## Families with a twin\n(.*?)\n\n", kernels_readme, re.S)
table_families = {row.split("|")[1].strip() for row in table.group(1).splitlines()[3:]} if table else set()
no_twin = re.search(r"No twin yet.*?:\n(.*?)\n\n", kernels_readme, re.S)
no_twin_words = words(re.sub(r"\(.*?\)", "", no_twin.group(1), flags=re.S)) if no_twin else set()
# configs/README.md: "<a>, <b> and <c> have none yet."
none_yet = re.search(r"([a-z0-9_, ]+?) have none yet", configs_readme.replace("\n", " "))
none_yet_words = words(none_yet.group(1)) - {"and"} if none_yet else set()

def compare(where, listed, expected):
    if listed != expected:
        failures.append(f"{where} lists {sorted(listed)}; the format table says {sorted(expected)}")

compare("kernels/README.md 'Families with a twin'", table_families, with_twin)
compare("kernels/README.md 'No twin yet'", no_twin_words & set(examples), without_twin)
compare("configs/README.md '... have none yet'", none_yet_words, without_twin)
for f in failures:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
EOF

exit $status
