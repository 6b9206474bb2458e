#!/bin/bash
# The host-side mutants that survived the first mutation run, applied one at a time;
# each must make the listed tests fail ("killed").  Run: bash scripts/mutation_check.sh
set -u
BACKUP=$(mktemp)
# Apply one source mutation at a time, run the tests that should kill it, restore.
cd "$(dirname "$0")/.."
run() {  # file, python-regex-from, to, tests
  cp "$1" "$BACKUP"
  python3 - "$1" "$2" "$3" <<'PY'
import sys, re
p, a, b = sys.argv[1:]
s = open(p).read()
n = s.count(a)
assert n >= 1, (p, a)
s = s.replace(a, b, 1)
open(p, 'w').write(s)
PY
  if .venv/bin/python -m pytest -q -x $4 >/dev/null 2>&1; then echo "SURVIVED  $1: $2 -> $3"; else echo "killed    $1: $2 -> $3"; fi
  cp "$BACKUP" "$1"
}
T="tests/test_surviving_mutants.py tests/test_runtime_tables.py tests/test_nccl_selection.py tests/test_verify.py tests/test_bad_inputs.py"
run runtime_cuda/core/tables.py "out[tb] = max(out.get(tb, -1), k)" "out[tb] = min(out.get(tb, -1), k)" "$T"
run runtime_cuda/core/tables.py 'if {a[0], b[0]} == {"i", "o"}:' 'if False:' "$T"
run runtime_cuda/core/tables.py 'a[1] < b[1] + cnt and b[1] < a[1] + cnt' 'a[1] <= b[1] + cnt and b[1] < a[1] + cnt' "$T"
run runtime_cuda/core/tables.py 'a[1] < b[1] + cnt and b[1] < a[1] + cnt' 'a[1] < b[1] + cnt' "$T"
run gc3/verify/runtime_limits.py 'and st.depid == -1 and not prev.hasdep' 'and st.depid == -1' "$T"
run gc3/verify/runtime_limits.py 'and st.depid == -1 and not prev.hasdep' 'and not prev.hasdep' "$T"
run gc3/verify/runtime_limits.py '(prev.dstbuf, prev.dstoff, prev.cnt) == (st.dstbuf, st.dstoff, st.cnt)' '(prev.dstbuf, prev.cnt) == (st.dstbuf, st.cnt)' "$T"
run gc3/verify/runtime_limits.py '(prev.dstbuf, prev.dstoff, prev.cnt) == (st.dstbuf, st.dstoff, st.cnt)' '(prev.dstbuf, prev.dstoff) == (st.dstbuf, st.dstoff)' "$T"
run runtime_cuda/nccl/selection.py 'if call.in_elems % cand.count_multiple:' 'if call.in_elems < cand.count_multiple:' "$T"
run runtime_cuda/nccl/catalog.py 's.count_multiple = _as_int(value, 1)' 's.count_multiple = _as_int(value, 0)' "$T"
