#!/usr/bin/env bash
# Multi-node pre-training on SLURM: one task per node, torchrun starts one process per GPU.
#
#   sbatch --nodes 8 scripts/slurm_pretrain.sh /data/bin base nodes8_gpu8_paper
#   sbatch --nodes 4 scripts/slurm_pretrain.sh /data/bin base nodes_n \
#       distributed_training.distributed_world_size=32
#   # CPU nodes (gloo), 2 processes per node:
#   sbatch --nodes 2 --gpus-per-node 0 --ntasks-per-node 2 scripts/slurm_pretrain.sh data/default tiny torchrun_cpu
#
# Arguments: DATA (output of ast-t5-preprocess), CONFIG (a file of config/pretrain), RUN_CONFIG
# (a file of config/pretrain/run_config); anything after is passed to fairseq-hydra-train as
# Hydra overrides. torchrun sets MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK/LOCAL_RANK for fairseq.
# Processes per node: $NPROC if set, else the GPUs of the allocation (SLURM_GPUS_ON_NODE, else
# nvidia-smi), else the tasks per node (SLURM_NTASKS_PER_NODE > 1); otherwise the script refuses.
# The rendezvous port is derived from the job id (two jobs on one node do not collide);
# $MASTER_PORT overrides it. $DIST_TIMEOUT_MIN (default 10) bounds the wait for all nodes, the
# rendezvous of the processes and every collective (task.distributed_timeout).
#SBATCH --job-name=ast-t5-pretrain
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=72:00:00
#SBATCH --output=logs/%x-%j.out
set -euo pipefail
die() { echo "slurm_pretrain.sh: error: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: sbatch [--nodes N] scripts/slurm_pretrain.sh DATA [CONFIG] [RUN_CONFIG] [OVERRIDES...]"
[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a SLURM job (SLURM_JOB_ID unset): submit with sbatch"
DATA=$1; CONFIG=${2:-base}; RUN_CONFIG=${3:-node8_gpu8}; shift $(( $# < 3 ? $# : 3 ))
[ -d "$DATA" ] || die "DATA=$DATA is not a directory"
REPO=${AST_T5_REPO:-$(cd "$(dirname "$0")/.." && pwd)}  # sbatch runs a copy of this script
[ -d "$REPO/config/pretrain" ] || REPO=${SLURM_SUBMIT_DIR:-$PWD}
[ -d "$REPO/config/pretrain" ] || die "config/pretrain not found: set AST_T5_REPO to the repository"
NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-$(( 20000 + SLURM_JOB_ID % 40000 ))}
if [ -n "${NPROC:-}" ]; then
    :
elif [ -n "${SLURM_GPUS_ON_NODE:-}" ] && [ "${SLURM_GPUS_ON_NODE}" -gt 0 ]; then
    NPROC=$SLURM_GPUS_ON_NODE
elif command -v nvidia-smi >/dev/null 2>&1 && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -gt 0 ]; then
    NPROC=$(nvidia-smi -L | grep -c '^GPU')
elif [ "${SLURM_NTASKS_PER_NODE:-1}" -gt 1 ] 2>/dev/null; then
    NPROC=$SLURM_NTASKS_PER_NODE
else
    die "cannot tell how many processes to start per node: no GPUs in the allocation" \
        "(SLURM_GPUS_ON_NODE unset, no nvidia-smi) and one task per node; set NPROC=N" \
        "or submit with --ntasks-per-node N (CPU: with RUN_CONFIG torchrun_cpu)"
fi
case $NPROC in ''|*[!0-9]*|0) die "NPROC=$NPROC is not a positive number of processes";; esac
TIMEOUT_MIN=${DIST_TIMEOUT_MIN:-10}
TIMEOUT_S=$(awk -v m="$TIMEOUT_MIN" 'BEGIN { s = int(m * 60); print (s > 0 ? s : 1) }')
echo "slurm_pretrain.sh: job $SLURM_JOB_ID: $NNODES node(s) x $NPROC process(es), rendezvous $MASTER_ADDR:$MASTER_PORT, timeout $TIMEOUT_MIN min" >&2
srun --kill-on-bad-exit=1 --nodes "$NNODES" --ntasks "$NNODES" --ntasks-per-node 1 torchrun \
    --nnodes "$NNODES" --nproc-per-node "$NPROC" \
    --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    --rdzv-conf "join_timeout=$TIMEOUT_S" \
    -m fairseq_cli.hydra_train \
    --config-dir "$REPO/config/pretrain" --config-name "$CONFIG" \
    task.data="$(cd "$DATA" && pwd)" +run_config="$RUN_CONFIG" task.distributed_timeout="$TIMEOUT_MIN" "$@"
