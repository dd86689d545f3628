"""Resume a ZeRO-1/2 state at another data-parallel size, through DeepSpeed's universal checkpoint.

ZeRO stages 1 and 2 shard the fp32 master weights and Adam moments by data-parallel rank, in flat buffers
whose layout depends on the DP size, so DeepSpeed refuses to load them at another size. Its universal
checkpoint (``deepspeed.checkpoint.ds_to_universal``) rewrites the shards as one file per parameter and
state (``zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt``), which an engine built with
``checkpoint.load_universal`` slices again for its own DP (and TP) layout.

What trilm adds: the layout facts DeepSpeed needs to merge tensor-parallel slices, read from the block
spec (:mod:`trilm.model.spec`): norm gains are replicated over TP ranks, the row-parallel linears (``wo``,
``w_down``) are split along inputs, everything else along outputs; and
the removal of megatron-core's ``_extra_state`` placeholders (None, which the converter cannot read). The
conversion goes to ``state/.universal-step-N`` and is deleted once loaded; the state itself is not touched.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
from pathlib import Path

import torch

from trilm.model.spec import FINAL_NORM, LINEARS, SUB_BLOCKS

ROW_PARALLEL = tuple(lin.leaf for lin in LINEARS if lin.parallel == "row")
"""Module names of the linears split along their inputs (``wo``, ``w_down``)."""
REPLICATED = (*(sub.norm for sub in SUB_BLOCKS), FINAL_NORM)
"""Module names of the norms, whose gains every tensor-parallel rank holds whole."""


def _names_pattern(names: tuple[str, ...]) -> str:
    return rf"^(.*\.)?({'|'.join(re.escape(n) for n in names)})\.weight$"


UNIVERSAL_INFO = {
    "universal_checkpoint_version": 0.4,
    "tp_replicated_parameter_patterns": [_names_pattern(REPLICATED)],
    "parameter_with_row_parallelism_patterns": [_names_pattern(ROW_PARALLEL)],
}


def universal_dir(state: Path) -> Path:
    return state.parent / f".universal-{state.name}"


def to_universal(state: Path, out: Path) -> Path:
    """Convert the DeepSpeed files of ``state`` (a complete ``state/step-N``) into a universal checkpoint
    at ``out`` (replaced if present). Single process: call it on one rank while the others wait."""
    # deferred for start-up time: loads deepspeed only when called
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    shutil.rmtree(out, ignore_errors=True)
    staging = out.parent / f"{out.name}.in"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for f in sorted(state.iterdir()):
            if f.name.startswith("mp_rank_") and f.name.endswith("_model_states.pt"):
                sd = torch.load(f, map_location="cpu", weights_only=False)
                sd["module"] = {k: v for k, v in sd["module"].items() if v is not None}
                sd["universal_checkpoint_info"] = UNIVERSAL_INFO
                torch.save(sd, staging / f.name)
            elif f.name.startswith("zero_pp_rank_") or f.name.startswith("bf16_zero_pp_rank_"):
                os.symlink(f.resolve(), staging / f.name)
        args = argparse.Namespace(
            input_folder=str(staging),
            output_folder=str(out),
            num_extract_workers=1,
            num_merge_workers=1,
            keep_temp_folder=False,
            strict=True,
            inject_missing_state=False,
        )
        with contextlib.redirect_stdout(io.StringIO()):  # the converter narrates every stage
            ds_to_universal(args)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
