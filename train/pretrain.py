"""Pretrain a TriLM / FloatLM / BiLM.

Launch (the same script everywhere; restarting the same command resumes from the newest complete state):

    python train/pretrain.py --config configs/train/quickstart-trilm.yaml           # 1 process, CPU or GPU
    python train/pretrain.py --config configs/train/quickstart-trilm.yaml --dry-run # plan only
    torchrun --nproc_per_node 2 train/pretrain.py --config C.yaml parallel.tensor_parallel=2
    deepspeed --num_gpus 8 train/pretrain.py --config configs/train/trilm-1.1b.yaml
    deepspeed --hostfile configs/launch/hostfile train/pretrain.py --config C.yaml   # N nodes (pdsh/ssh)
    deepspeed --hostfile H --no_ssh --node_rank R --master_addr HEAD \
        train/pretrain.py --config C.yaml                                           # on node R
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank R --master-addr HEAD --master-port 29500 \
        train/pretrain.py --config C.yaml                                           # on node R
    sbatch --nodes 4 configs/launch/pretrain.sbatch configs/train/trilm-3.9b.yaml     # SLURM
    torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \
        train/pretrain.py --config C.yaml                                           # torchrun rendezvous

Overrides are dotted ``key=value`` pairs after the config (e.g. ``tokens=2e9 zero_stage=2``).
"""

import sys

from trilm.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
