#!/usr/bin/env bash
# The test command from README.md: install everything, then run the whole CPU test suite.
# GPU tests skip with a visible reason when no GPU is present (see `pytest -rs`).
# The suite runs in AST_T5_TEST_PROCS processes (default 2, pytest-xdist, from the test extras): on
# the 2-core CI machine 12 minutes instead of 21 one at a time (2026-11-27, 1057 passed either way); 18 minutes
# for 1098 tests on 2026-11-28, 16 for 1265 later that day, up to 19 for 1267 in later runs. Idle processes take
# queued tests from busy ones (`--dist worksteal`) and the GPU-codegen checks share one process: 14-15 minutes
# for the same tests in fresh-clone CI runs (2026-11-28).
# AST_T5_TEST_PROCS=1 runs it in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=${PYTHON:-python3}
procs=()
if [ "${AST_T5_TEST_PROCS:-2}" != 1 ] && "$PY" -c "import xdist" 2>/dev/null; then
  procs=(-n "${AST_T5_TEST_PROCS:-2}" --dist worksteal)
fi
"$PY" -m pytest -q -rs ${procs[@]+"${procs[@]}"} "$@"
