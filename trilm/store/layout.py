"""The names of the files and folders trilm's model directories are made of: one place for each.

A **snapshot** (what training writes per checkpoint, and what imports, QuantLMs, packed exports and pruned
models are)::

    config.json           {"format": "trilm-snapshot", "version", "model": ModelConfig, "meta": SnapshotMeta}
    model.safetensors     canonical float tensors (latent weights of TriLM/BiLM)
    packed.safetensors    optional: packed block linears (``trilm.formats``) named by canonical name
                          without ``.weight``; their float tensors are then absent from model.safetensors
    tokenizer.model       optional: the SentencePiece model (a training run keeps it two levels up)
    COMPLETE              written last: the manifest, size and CRC-32 of every other file

A **run directory** holds ``resolved_config.yaml``, ``tokenizer.model``, ``snapshots/step-N/`` and
``state/step-N/``. An **export** directory (HF, packed) carries ``trilm_export.json`` saying what it is an
export of; an exported **suite** has ``suite_index.json`` and one ``<run>/step-N/`` folder per checkpoint
(``checkpoint.json``, ``latent/``, ``hf/``, ``packed/``, ``gguf/``).
"""

from __future__ import annotations

import re

SNAPSHOT_FORMAT = "trilm-snapshot"
SNAPSHOT_VERSION = 1

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PACKED_FILE = "packed.safetensors"
TOKENIZER_FILE = "tokenizer.model"
COMPLETE = "COMPLETE"

EXPORT_MARKER = "trilm_export.json"
SUITE_INDEX = "suite_index.json"
SUITE_INDEX_CSV = "suite_index.csv"
SUITE_ENTRY = "checkpoint.json"

RUN_CONFIG = "resolved_config.yaml"
SNAPSHOTS_DIR = "snapshots"
STATES_DIR = "state"
LOCK_FILE = ".lock"
STEP_DIR = re.compile(r"^step-(\d+)$")

HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"


def step_dir_name(step: int) -> str:
    return f"step-{step}"
