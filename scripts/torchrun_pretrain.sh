#!/usr/bin/env bash
# Pre-training on one or more nodes with torchrun and the standard variables.
#
#   # one node, 8 GPUs
#   bash scripts/torchrun_pretrain.sh /data/bin base node8_gpu8
#   # node r of N (run on every node with the same MASTER_ADDR/MASTER_PORT):
#   NNODES=4 NODE_RANK=r MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 \
#       bash scripts/torchrun_pretrain.sh /data/bin base nodes_n distributed_training.distributed_world_size=32
#   # CPU only (2 processes, gloo), e.g. to try the set-up on a laptop:
#   NPROC=2 bash scripts/torchrun_pretrain.sh data/default tiny torchrun_cpu
set -euo pipefail
DATA=$1; CONFIG=${2:-base}; RUN_CONFIG=${3:-node8_gpu8}; shift $(( $# < 3 ? $# : 3 ))
REPO=$(cd "$(dirname "$0")/.." && pwd)
torchrun --nnodes "${NNODES:-1}" --node-rank "${NODE_RANK:-0}" --nproc-per-node "${NPROC:-8}" \
    --master-addr "${MASTER_ADDR:-127.0.0.1}" --master-port "${MASTER_PORT:-29500}" \
    -m fairseq_cli.hydra_train \
    --config-dir "$REPO/config/pretrain" --config-name "$CONFIG" \
    task.data="$(cd "$DATA" && pwd)" +run_config="$RUN_CONFIG" "$@"
