#!/usr/bin/env bash
# Does the AST objective pay? Train arms at equal training tokens and judge them on held-out code.
#
#   bash scripts/ablate.sh tiny                 # CPU smoke recipe on the embedded default corpus
#   bash scripts/ablate.sh small /data/code     # one-H100-hour recipe on your corpus (GPU)
#   OUT=abl EXTRA="--seeds 1,2" bash scripts/ablate.sh small /data/code
#
# Preprocesses INPUTS (default: the embedded corpus) twice with the same tokenizer, AST-aware
# and fixed-length segments, then runs ast-t5-ablate; rerunning resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:-tiny}
shift || true
OUT=${OUT:-ablation/$RECIPE}
DATA=${DATA:-$OUT/corpus}
mkdir -p "$OUT"
if [ "$RECIPE" = tiny ]; then
    PRE="--vocab-size 4000 --max-tokens 256 --workers 2"
else
    PRE="--vocab-size 32000 --max-tokens 1024 --workers ${WORKERS:-8}"
fi
ast-t5-preprocess run "$@" -o "$DATA" $PRE
ast-t5-preprocess run "$@" -o "$DATA.fixed" $PRE --spm-model "$DATA/spm.model" --segmenter fixed
ast-t5-ablate --recipe "$RECIPE" --corpus "$DATA" --fixed-corpus "$DATA.fixed" -o "$OUT" ${EXTRA:-}
