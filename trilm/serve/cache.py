"""The static KV cache: keys and values of every running sequence, preallocated once.

One pair of tensors per attention layer, ``[slots, kv_heads, max_len + 1, head_dim]``, sized by that layer's
own KV heads (a pruned layer with fewer heads caches fewer; a layer without attention caches nothing).
Nothing is allocated per request or per token, so the decode step has fixed shapes and can be captured in
a CUDA graph. Running sequences occupy slots ``0 .. n−1``: a decode step of ``n`` sequences reads
``cache[:n]`` as a view, without gathering, and the engine keeps the slots dense by moving the last
sequence into a freed slot (:meth:`KVCache.move`).

The extra position ``max_len`` is scratch: padding rows of a CUDA-graph batch bucket, and graph capture
itself, write their keys there, never into a live sequence's positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trilm.model.config import ModelConfig


class KVCache:
    """Preallocated keys/values for ``slots`` sequences of up to ``max_len`` tokens each."""

    def __init__(
        self,
        cfg: ModelConfig,
        slots: int,
        max_len: int,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        if slots < 1:
            raise ValueError(f"slots: must be >= 1, got {slots}")
        if not 1 <= max_len <= cfg.context:
            raise ValueError(f"max_len: must be in [1, {cfg.context}] (the model context), got {max_len}")
        self.slots, self.max_len, self.scratch = slots, max_len, max_len
        self.dtype = dtype
        hd = cfg.head_dim
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        for shape in cfg.layer_shapes():
            if shape.kv_heads:
                size = (slots, shape.kv_heads, max_len + 1, hd)
                self.keys.append(torch.zeros(size, device=device, dtype=dtype))
                self.values.append(torch.zeros(size, device=device, dtype=dtype))
            else:
                self.keys.append(None)
                self.values.append(None)
        self._rows = torch.arange(slots, device=device)
        self._span = torch.arange(max_len + 1, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)

    def prefill(self, slot: int, length: int) -> PrefillStep:
        """The KV views of a prompt of ``length`` tokens written to ``slot`` at positions 0 .. length−1."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} out of range [0, {self.slots})")
        if not 1 <= length <= self.max_len:
            raise ValueError(f"prompt of {length} tokens does not fit the cache ({self.max_len} positions)")
        return PrefillStep(self, slot, length)

    def decode(self, batch: int, span: int, positions: torch.Tensor, *, masked: bool = True) -> DecodeStep:
        """The KV views of one new token for each of slots ``0 .. batch−1``, written at ``positions`` [batch]
        (on the cache's device), attending over the first ``span`` cached positions.

        ``masked=False`` is for a caller that knows every position equals ``span − 1`` (one sequence, or
        sequences of equal length): all ``span`` positions are then attended and no mask is built."""
        return DecodeStep(self, batch, span, positions, masked=masked)

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst``."""
        for k, v in zip(self.keys, self.values):
            if k is not None and v is not None:
                k[dst, :, :length] = k[src, :, :length]
                v[dst, :, :length] = v[src, :, :length]


class _PrefillView:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slot: int, length: int):
        self.keys, self.values, self.slot, self.length = keys, values, slot, length

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.keys[self.slot, :, : self.length] = k[0]
        self.values[self.slot, :, : self.length] = v[0]
        gqa = q.shape[1] != k.shape[1]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


class PrefillStep:
    """A whole prompt at once: causal attention over its own keys, which are also stored in its slot."""

    def __init__(self, cache: KVCache, slot: int, length: int):
        self.cache, self.slot, self.length = cache, slot, length

    def layer(self, index: int) -> _PrefillView:
        c = self.cache
        return _PrefillView(c.keys[index], c.values[index], self.slot, self.length)


class _DecodeView:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor, step: DecodeStep):
        self.keys, self.values, self.step = keys, values, step

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        step = self.step
        b, heads, _, hd = q.shape
        kv_heads = k.shape[1]
        self.keys[step.rows, :, step.positions] = k[:, :, 0]
        self.values[step.rows, :, step.positions] = v[:, :, 0]
        keys = self.keys[:b, :, : step.span]
        values = self.values[:b, :, : step.span]
        # One query token per sequence: the query heads of a GQA group are the "sequence" of their KV head,
        # so the shared keys are used as they are (no repeat, no GQA support needed from the SDPA backend).
        grouped = q.reshape(b, kv_heads, heads // kv_heads, hd)
        if grouped.device.type == "cpu" and grouped.dtype != torch.float32:
            out = _attend_fp32(grouped, keys, values, step.mask)
        else:
            out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=step.mask)
        return out.reshape(b, heads, 1, hd)


def _attend_fp32(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None):
    """SDPA of a few query rows in fp32, for bf16/fp16 caches on CPU: torch's CPU flash-attention kernel
    in bf16 costs 2–3× these plain products at one query per sequence (and under ``torch.compile`` the
    scale, mask and softmax fuse into one loop). fp32 throughout, so it is at least as exact as SDPA."""
    scores = torch.matmul(q.float(), keys.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores + mask
    return torch.matmul(scores.softmax(-1), values.float()).to(q.dtype)


class DecodeStep:
    """One token per running sequence, attending over its cached positions ``0 .. position``."""

    def __init__(self, cache: KVCache, batch: int, span: int, positions: torch.Tensor, masked: bool = True):
        if not 1 <= batch <= cache.slots:
            raise ValueError(f"decode batch {batch} out of range [1, {cache.slots}]")
        if not 1 <= span <= cache.max_len + 1:
            raise ValueError(f"attention span {span} out of range [1, {cache.max_len + 1}]")
        self.cache, self.span = cache, span
        self.rows = cache._rows[:batch]
        self.positions = positions
        self.mask = None
        if masked:  # additive, in the cache dtype: SDPA's fast paths take a float mask, not a boolean one
            beyond = cache._span[:span].unsqueeze(0) > positions.unsqueeze(1)
            dtype = cache.dtype
            zeros = torch.zeros(beyond.shape, dtype=dtype, device=beyond.device)
            self.mask = zeros.masked_fill(beyond, float("-inf"))[:, None, None, :]

    def layer(self, index: int) -> _DecodeView:
        return _DecodeView(self.cache.keys[index], self.cache.values[index], self)
