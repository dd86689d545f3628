"""What trilm's tests and its multi-node drills share: the loopback cluster (:mod:`trilm.testing.cluster`),
which starts torchrun, the DeepSpeed launcher, an sshd and a SLURM on one machine."""
