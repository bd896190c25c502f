#!/usr/bin/env bash
# The test command from README.md: install everything, then run the whole CPU test suite.
# GPU tests skip with a visible reason when no GPU is present (see `pytest -rs`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
"${PYTHON:-python3}" -m pytest -q -rs "$@"
