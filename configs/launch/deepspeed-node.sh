#!/usr/bin/env bash
# One node's part of a multi-node run under SLURM, started by `srun` as one task per node (from
# pretrain.sbatch and from the scripts `trilm suite launch --slurm` writes): the DeepSpeed launcher with no
# ssh, told which node it is, starting PROCS_PER_NODE training processes here. No node logs into another,
# and SLURM tracks (and scancel reaches) every process of the run.
#   needs: PROCS_PER_NODE, MASTER_ADDR, MASTER_PORT; arguments: --config CONFIG.yaml [key=value ...]
#   DEEPSPEED: the launcher of the environment trilm is installed in (default: `deepspeed` on PATH); each
#   process runs `python -m trilm.train` with that environment's python, so no checkout is needed.
set -euo pipefail
DEEPSPEED=${DEEPSPEED:-deepspeed}
HOSTFILE=$(mktemp "${TMPDIR:-/tmp}/trilm-hostfile-XXXXXX")
trap 'rm -f "$HOSTFILE"' EXIT
# The same node order on every node (node rank r = SLURM_NODEID); host names are only labels here.
scontrol show hostnames "${SLURM_STEP_NODELIST:-$SLURM_JOB_NODELIST}" | sed "s/\$/ slots=${PROCS_PER_NODE}/" > "$HOSTFILE"
"$DEEPSPEED" --hostfile "$HOSTFILE" --no_ssh --node_rank "$SLURM_NODEID" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" --module trilm.train "$@"
