#!/usr/bin/env bash
# Pre-training on one or more nodes with torchrun and the standard variables.
#
#   # one node, one process per GPU:
#   bash scripts/torchrun_pretrain.sh /data/bin base node8_gpu8
#   # node r of N (run on every node with the same MASTER_ADDR/MASTER_PORT):
#   NNODES=4 NODE_RANK=r MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 \
#       bash scripts/torchrun_pretrain.sh /data/bin base nodes_n distributed_training.distributed_world_size=32
#   # CPU only (2 processes, gloo), e.g. to try the set-up on a laptop:
#   NPROC=2 bash scripts/torchrun_pretrain.sh data/default tiny torchrun_cpu
#
# Processes per node: $NPROC, else the GPUs nvidia-smi lists; without either the script refuses.
# $DIST_TIMEOUT_MIN (default 10) bounds the wait for the other nodes, the rendezvous of the
# processes and every collective (task.distributed_timeout).
set -euo pipefail
die() { echo "torchrun_pretrain.sh: error: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: scripts/torchrun_pretrain.sh DATA [CONFIG] [RUN_CONFIG] [OVERRIDES...]"
DATA=$1; CONFIG=${2:-base}; RUN_CONFIG=${3:-node8_gpu8}; shift $(( $# < 3 ? $# : 3 ))
[ -d "$DATA" ] || die "DATA=$DATA is not a directory"
REPO=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${NPROC:-}" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -gt 0 ]; then
        NPROC=$(nvidia-smi -L | grep -c '^GPU')
    else
        die "no GPU found (nvidia-smi): set NPROC, e.g. NPROC=2 with RUN_CONFIG torchrun_cpu"
    fi
fi
case $NPROC in ''|*[!0-9]*|0) die "NPROC=$NPROC is not a positive number of processes";; esac
TIMEOUT_MIN=${DIST_TIMEOUT_MIN:-10}
TIMEOUT_S=$(awk -v m="$TIMEOUT_MIN" 'BEGIN { s = int(m * 60); print (s > 0 ? s : 1) }')
torchrun --nnodes "${NNODES:-1}" --node-rank "${NODE_RANK:-0}" --nproc-per-node "$NPROC" \
    --master-addr "${MASTER_ADDR:-127.0.0.1}" --master-port "${MASTER_PORT:-29500}" \
    --rdzv-conf "timeout=$TIMEOUT_S" \
    -m fairseq_cli.hydra_train \
    --config-dir "$REPO/config/pretrain" --config-name "$CONFIG" \
    task.data="$(cd "$DATA" && pwd)" +run_config="$RUN_CONFIG" task.distributed_timeout="$TIMEOUT_MIN" "$@"
