#!/usr/bin/env bash
# The main job, end to end on the embedded default corpus (this interpreter's standard library
# plus bundled samples of 8 more languages), on CPU in a few minutes:
#   corpus -> tokenizer -> binarized data + ASTs -> pre-training of config/pretrain/tiny.yaml
#   (a few hundred updates; watch the loss fall) -> a span-infilling sample from the checkpoint.
#
#   bash scripts/quickstart.sh                      # outputs in data/default, checkpoints/tiny
#   DATA=/tmp/d CKPT=/tmp/c UPDATES=500 bash scripts/quickstart.sh
#   TEMPERATURE=1 bash scripts/quickstart.sh        # languages by their share of tokens (3: flatter)
# Re-running skips what is complete: preprocessing, and training (it says "training is complete"
# when the checkpoint is at UPDATES; a larger UPDATES resumes from it).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-data/default}
CKPT=${CKPT:-checkpoints/tiny}
UPDATES=${UPDATES:-300}
# The default corpus is ~98% Python by tokens (the standard library; the other languages have a
# bundled file or two each): sampling languages by share ** (1 / T) shows them to the model.
TEMPERATURE=${TEMPERATURE:-3}
mkdir -p "$DATA" "$CKPT"
DATA=$(cd "$DATA" && pwd); CKPT=$(cd "$CKPT" && pwd)

echo "== 1/3 preprocessing the default corpus into $DATA"
ast-t5-preprocess run -o "$DATA" --vocab-size 8000 --workers 2

echo "-- language mixture (sampling temperature $TEMPERATURE: probability ~ share ** (1 / T))"
python - "$DATA" "$TEMPERATURE" <<'PY'
import json, sys
from ast_t5.data.loading import mixture_probabilities
weights = json.load(open(sys.argv[1] + "/data_weights.json"))
probs = mixture_probabilities(weights, float(sys.argv[2]))
for lang in sorted(weights, key=lambda l: -weights[l]):
    note = "" if lang in probs else "   (no training file: its files hashed into valid/test)"
    print(f"  {lang:<11} {weights[lang] * 100:6.2f}% of training tokens -> "
          f"{probs.get(lang, 0.0) * 100:6.2f}% of samples{note}")
PY

echo "== 2/3 pre-training config/pretrain/tiny.yaml for $UPDATES updates (CPU)"
fairseq-hydra-train --config-name tiny \
    task.data="$DATA" checkpoint.save_dir="$CKPT" optimization.max_update="$UPDATES" \
    task.sampling_temperature="$TEMPERATURE"

echo "== 3/3 span infilling with $CKPT/checkpoint_last.pt"
PROMPT=$'def read_lines(path):\n    with open(path) as f:\n        <extra_id_0>\n'
printf '%s' "$PROMPT"
echo "-- filled in by the model:"
ast-t5-generate "$CKPT/checkpoint_last.pt" --mode infill --prompt "$PROMPT" --max-new-tokens 32
