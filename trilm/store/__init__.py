"""The model store: every model directory trilm reads or writes is opened, verified and written here.

::

    from trilm.store import open_model
    m = open_model("runs/quickstart/trilm-tiny/snapshots/step-120")
    m.kind, m.config, m.meta.step, m.tokenizer.path, m.add_bos
    state = m.weights.float_state()          # verified against COMPLETE, finite, by canonical name

Modules: :mod:`~trilm.store.layout` (file names), :mod:`~trilm.store.integrity` (the ``COMPLETE``
manifest), :mod:`~trilm.store.tensors` (safetensors with named errors), :mod:`~trilm.store.snapshot`
(the snapshot writer), :mod:`~trilm.store.tokenizer` (the one tokenizer policy, BOS),
:mod:`~trilm.store.hf` (HF directories), :mod:`~trilm.store.open` (``open_model``),
:mod:`~trilm.store.discovery` (checkpoints of runs and suites). Files are written through
:mod:`trilm.atomic`. The store needs no megatron: a training model to and from a directory is
:mod:`trilm.train.models` (``load_model``, ``save_model``); an inference model is
:func:`trilm.infer.load_inference_model`.
"""

from trilm.store.discovery import Checkpoint, discover
from trilm.store.errors import IntegrityError, StoreError
from trilm.store.integrity import complete_steps, latest_complete
from trilm.store.open import KINDS, ModelDir, open_model
from trilm.store.snapshot import read_snapshot_config, write_snapshot

__all__ = [
    "KINDS",
    "Checkpoint",
    "IntegrityError",
    "ModelDir",
    "StoreError",
    "complete_steps",
    "discover",
    "latest_complete",
    "open_model",
    "read_snapshot_config",
    "write_snapshot",
]
