# Shared by the CLI tests (tests/cli/test_*.sh): `source "$(dirname "$0")/lib.sh"` after
# reading $1 = kvbudget binary and $2 = source dir. Gives a scratch directory $tmp
# (removed on exit), `fail` (records a failure in $status; end the test with
# `exit $status`), `expect`, and CSV helpers that read quoted fields properly (point
# keys hold commas) through Debian's python3.
set -u
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
status=0
fail() { echo "FAIL: $*" >&2; status=1; }
# expect FILE STRING WHAT: FILE contains the fixed STRING (else its start is shown).
expect() {
  grep -qF -- "$2" "$1" || { fail "'$2' not in $3"; sed 's/^/    /' "$1" | head -40 >&2; }
}
# Every row of a CSV has as many fields as its header (no truncated rows).
csv_ok() {
  /usr/bin/python3 -c 'import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
sys.exit(any(len(r) != len(rows[0]) for r in rows))' "$1"
}
# has_column CSV NAME: the header names NAME.
has_column() { /usr/bin/python3 -c 'import csv, sys; sys.exit(sys.argv[2] not in next(csv.reader(open(sys.argv[1]))))' "$1" "$2"; }
# points.csv without its timing column, one row per line, for comparing numbers across runs.
numbers() {
  /usr/bin/python3 -c 'import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    r.pop("seconds"); print(r)' "$1"
}
