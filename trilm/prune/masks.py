"""Unit masks applied inside the inference model's forward pass, through hooks (no weight is touched).

- head: a forward pre-hook on ``attn.wo`` multiplies the attention output, per query head, by the mask of the
  head's KV group (query head h reads KV head h // group, the convention of SDPA's ``enable_gqa`` and HF's
  ``repeat_kv``). A zero there removes exactly what deleting the group's q/k/v rows and wo columns removes.
- channel: a forward pre-hook on ``mlp.w_down`` multiplies the SwiGLU activations.
- layer: a forward hook on the block returns ``x + m·(block(x) − x)``: the block's input for m = 0, its
  output for m = 1 (returned untouched, so a kept block is bit-identical).

Masks are set per forward (``set``); ``None`` switches masking off. Masks are plain tensors outside autograd,
so the search never builds a graph through the model.
"""

from __future__ import annotations

import torch

from trilm.infer.model import InferenceModel
from trilm.prune.units import UnitGroup


class UnitMasks:
    """Hooks that mask the units of one or more groups; use as a context manager or call ``remove()``."""

    def __init__(self, model: InferenceModel, groups: list[UnitGroup]):
        self.model = model
        self.groups = list(groups)
        self._per_layer: dict[str, list[torch.Tensor | None] | None] = {g.granularity: None for g in groups}
        self._handles = []
        cfg = model.cfg
        self._head_width = (cfg.heads // cfg.num_kv_heads) * cfg.head_dim
        for group in self.groups:
            for i, layer in enumerate(model.layers):
                if group.counts[i] == 0:
                    continue
                if group.granularity == "head":
                    hook = self._pre_hook("head", i)
                    self._handles.append(layer.attn.wo.register_forward_pre_hook(hook))
                elif group.granularity == "channel":
                    hook = self._pre_hook("channel", i)
                    self._handles.append(layer.mlp.w_down.register_forward_pre_hook(hook))
                else:
                    self._handles.append(layer.register_forward_hook(self._block_hook(i)))

    def set(self, masks: dict[str, torch.Tensor] | None, *, detach: bool = True) -> None:
        """``{granularity: flat mask over that group's units}`` (0/1 floats); None = no masking.

        ``detach=False`` keeps head and channel masks in autograd (continuous masks for a gradient-based
        comparison); block masks always enter as numbers."""
        for group in self.groups:
            flat = None if masks is None else masks.get(group.granularity)
            if flat is None:
                self._per_layer[group.granularity] = None
                continue
            if flat.numel() != group.total:
                raise ValueError(
                    f"{group.granularity} mask has {flat.numel()} entries, expected {group.total}"
                )
            pieces = group.split(flat.detach() if detach else flat)
            if group.granularity == "head":
                pieces = [p.repeat_interleave(self._head_width) for p in pieces]
            self._per_layer[group.granularity] = pieces

    def _pre_hook(self, granularity: str, index: int):
        def hook(_module, args):
            masks = self._per_layer[granularity]
            if masks is None:
                return None
            (x,) = args
            return (x * masks[index].to(x.dtype),)

        return hook

    def _block_hook(self, index: int):
        def hook(_module, args, out):
            masks = self._per_layer["layer"]
            if masks is None:
                return None
            m = float(masks[index])
            if m == 1.0:
                return None
            (x,) = args[:1]
            return x if m == 0.0 else x + m * (out - x)

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> UnitMasks:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
