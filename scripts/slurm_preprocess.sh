#!/usr/bin/env bash
# Preprocess a corpus on SLURM: size it, train the tokenizer once, one array task per shard,
# then merge. Submits three dependent jobs and prints their ids.
#
#   bash scripts/slurm_preprocess.sh OUT NUM_SHARDS INPUT...
#   bash scripts/slurm_preprocess.sh /data/bin 64 /data/the-stack/data/python /data/more.jsonl.zst
#   INPUT_ARGS="--content-column text" SPM_ARGS="--vocab-size 32000" RUN_ARGS="--max-tokens 1024" \
#       CPUS=16 bash scripts/slurm_preprocess.sh /data/bin 256 /data/starcoderdata/*/train-*.parquet
#
# INPUT: directories (source trees; .parquet and .jsonl[.gz|.zst] files and datasets.save_to_disk
# folders inside them are read as records), Parquet files (The Stack v1, StarCoderData),
# .jsonl/.jsonl.gz/.jsonl.zst files, save_to_disk folders. Options: INPUT_ARGS (--language,
# --content-column, --path-column, --lang-column) go to every stage, SPM_ARGS (tokenizer) to
# train-spm, run and merge, RUN_ARGS to run and merge: shards and merge check them with a
# fingerprint and refuse a mismatch.
# Restart: a killed or failed array task leaves no partial shard; resubmit the same command
# (complete shards are skipped, the output is byte-identical), or `sbatch --array=<ids>` the
# missing ones. PLAN=1 first prints `ast-t5-preprocess plan`: the bytes each shard will process.
# Each array task opens and decompresses only its own units of the record files (Parquet row
# groups, .jsonl* files, Arrow files, placed by size) and its share of the source files (by path
# hash): N tasks decompress the corpus once in all. Do not change the input files between the
# tasks: their sizes are part of the assignment, and shards of another assignment are refused.
set -euo pipefail
OUT=$1; NUM_SHARDS=$2; shift 2
INPUTS=("$@")
CPUS=${CPUS:-8}                 # worker processes per shard task
MAX_PARALLEL=${MAX_PARALLEL:-64}  # array tasks running at once
IN=${INPUT_ARGS:-}; SPM=${SPM_ARGS:-}; RUN=${RUN_ARGS:-}
mkdir -p "$OUT" logs
q() { printf '%q ' "$@"; }

if [[ ${PLAN:-0} == 1 ]]; then  # streams record files once (units per shard, input MB per task)
    ast-t5-preprocess plan $(q "${INPUTS[@]}") --num-shards "$NUM_SHARDS" $IN
fi

spm=$(sbatch --parsable --job-name=ast-t5-spm --cpus-per-task=4 --mem=32G --time=4:00:00 \
    --output=logs/%x-%j.out \
    --wrap "ast-t5-preprocess train-spm $(q "${INPUTS[@]}") -o $(q "$OUT") $IN $SPM")
shards=$(sbatch --parsable --job-name=ast-t5-shard --dependency=afterok:"$spm" \
    --array=0-$((NUM_SHARDS - 1))%"$MAX_PARALLEL" --cpus-per-task="$CPUS" \
    --mem-per-cpu=2G --time=24:00:00 --output=logs/%x-%A_%a.out \
    --wrap "ast-t5-preprocess run $(q "${INPUTS[@]}") -o $(q "$OUT") --num-shards $NUM_SHARDS \
        --shard-id \$SLURM_ARRAY_TASK_ID --workers $CPUS --log-interval 300 $IN $SPM $RUN")
merge=$(sbatch --parsable --job-name=ast-t5-merge --dependency=afterok:"$shards" \
    --cpus-per-task=2 --mem=16G --time=12:00:00 --output=logs/%x-%j.out \
    --wrap "ast-t5-preprocess merge $(q "${INPUTS[@]}") -o $(q "$OUT") --num-shards $NUM_SHARDS $IN $SPM $RUN")
echo "submitted: tokenizer $spm, shards $shards (array of $NUM_SHARDS), merge $merge"
