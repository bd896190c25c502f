#!/usr/bin/env bash
# Multi-node pre-training on SLURM: one task per node, torchrun starts one process per GPU.
#
#   sbatch --nodes 8 scripts/slurm_pretrain.sh /data/bin base nodes8_gpu8_paper
#   sbatch --nodes 4 scripts/slurm_pretrain.sh /data/bin base nodes_n \
#       distributed_training.distributed_world_size=32
#
# Arguments: DATA (output of ast-t5-preprocess), CONFIG (a file of config/pretrain), RUN_CONFIG
# (a file of config/pretrain/run_config); anything after is passed to fairseq-hydra-train as
# Hydra overrides. torchrun sets MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK/LOCAL_RANK for fairseq.
#SBATCH --job-name=ast-t5-pretrain
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=72:00:00
#SBATCH --output=logs/%x-%j.out
set -euo pipefail
DATA=$1; CONFIG=${2:-base}; RUN_CONFIG=${3:-node8_gpu8}; shift $(( $# < 3 ? $# : 3 ))
REPO=$(cd "$(dirname "$0")/.." && pwd)
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-8}
srun --kill-on-bad-exit=1 torchrun \
    --nnodes "$SLURM_JOB_NUM_NODES" --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" \
    -m fairseq_cli.hydra_train \
    --config-dir "$REPO/config/pretrain" --config-name "$CONFIG" \
    task.data="$DATA" +run_config="$RUN_CONFIG" "$@"
