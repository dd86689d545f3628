"""Pretraining: the trainer, its config and plan, checkpoints and resharding (megatron-core + DeepSpeed).

``python -m trilm.train --config C.yaml`` (or ``trilm train``) is the entry point every launcher runs;
:mod:`trilm.train.models` loads and saves training models from and to model directories. Importing this
package imports nothing heavy: megatron and DeepSpeed load with the modules that need them.
"""
