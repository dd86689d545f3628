"""Random packed weights of every format, to exercise the kernels: the kernel tests, the kernel benchmarks, a
check of a new GPU. In the library because tests and benchmarks both build them and neither imports the other.

Codes and scales are drawn directly (no float weight is quantized), with scales ~ 1/sqrt(K) so that
x ~ N(0, 1) gives outputs of order one in fp16. Everything is generated with torch ops on ``device``, so
LLaMA-sized layers are quick to build on a GPU.
"""

from __future__ import annotations

import dataclasses

import torch

from trilm.formats import (
    BinaryWeight,
    IntWeight,
    MultiBinaryWeight,
    NMBinaryWeight,
    PackedWeight,
    PBLLMWeight,
    ResidualGroup,
    TernaryWeight,
)

KINDS = (
    "ternary",
    "binary",
    "binary_mean",
    "nm2:4",
    "nm4:8",
    "billm",
    "stbllm",
    "int2",
    "int3",
    "int4",
    "int4_act",
    "pbllm",
)
"""Sample kinds: each names a packed format and the settings a method of that family produces."""

BILLM_GROUPS = (ResidualGroup(1, 0), ResidualGroup(1, 0), ResidualGroup(2, 1))
"""BiLLM: class 0 (non-salient columns) has two order-1 groups; class 1 (salient columns) is order 2."""
STBLLM_GROUPS = (
    ResidualGroup(0, 0),
    ResidualGroup(1, 0),
    ResidualGroup(1, 0),
    ResidualGroup(1, 0),
    ResidualGroup(0, 1),
    ResidualGroup(2, 1),
)
"""STBLLM: per class a pruned group (order 0, value 0); non-salient kept weights in three order-1 groups."""


def nm_codes(n: int, k: int, keep: int, m: int, gen: torch.Generator, device) -> torch.Tensor:
    """Random ±1 codes (n, k) with exactly ``keep`` non-zeros in every group of ``m`` inputs."""
    scores = torch.rand((n, k // m, m), generator=gen, device=device)
    idx = scores.topk(keep, dim=-1).indices
    signs = torch.randint(0, 2, (n, k // m, keep), generator=gen, device=device) * 2 - 1
    codes = torch.zeros((n, k // m, m), dtype=torch.int64, device=device)
    codes.scatter_(-1, idx, signs)
    return codes.reshape(n, k)


def random_packed(
    kind: str,
    n: int,
    k: int,
    *,
    group_size: int | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    scale_dtype: torch.dtype = torch.float32,
) -> PackedWeight:
    """A random packed weight (out n, in k) of ``kind`` (one of :data:`KINDS`); ``group_size`` None → default.

    Defaults: ternary/binary/N:M per-row scales (g = k), int formats g = 128 when it divides k (else per row),
    BiLLM/STBLLM blocks of 128 (or k), PB-LLM 10 % salient weights with per-row α, μ.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown sample kind {kind!r}; choose from {KINDS}")
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)

    def rand(*shape):
        return torch.rand(shape, generator=gen, device=dev)

    def table(g: int, lo: float = 0.5, hi: float = 1.5) -> torch.Tensor:
        return ((lo + (hi - lo) * rand(k // g, n)) / k**0.5).to(scale_dtype)

    def signs(*shape):
        return torch.randint(0, 2, shape, generator=gen, device=dev) * 2 - 1

    if kind == "ternary":
        g = group_size or k
        return TernaryWeight.pack(torch.randint(-1, 2, (n, k), generator=gen, device=dev), table(g))
    if kind in ("binary", "binary_mean"):
        g = group_size or k
        means = (table(g, -0.5, 0.5)) if kind == "binary_mean" else None
        return BinaryWeight.pack(signs(n, k), table(g), means)
    if kind in ("nm2:4", "nm4:8"):
        keep, m = (2, 4) if kind == "nm2:4" else (4, 8)
        g = group_size or k
        return NMBinaryWeight.pack(nm_codes(n, k, keep, m, gen, dev), table(g), keep, m)
    if kind in ("int2", "int3", "int4", "int4_act"):
        bits = int(kind[3])
        g = group_size or (128 if k % 128 == 0 else k)
        codes = torch.randint(0, 1 << bits, (n, k), generator=gen, device=dev)
        zeros = torch.randint(0, 1 << bits, (k // g, n), generator=gen, device=dev).float()
        scales = table(g) * 2 / (1 << bits)
        g_idx = None
        if kind == "int4_act":
            perm = torch.randperm(k, generator=gen, device=dev)
            g_idx = torch.empty(k, dtype=torch.int32, device=dev)
            g_idx[perm] = (torch.arange(k, device=dev) // g).to(torch.int32)
        return IntWeight.pack(codes, scales, zeros, bits, g_idx=g_idx, scale_dtype=torch.float16)
    if kind in ("billm", "stbllm"):
        block = group_size or min(128, k)
        n_blocks = -(-k // block)
        groups = BILLM_GROUPS if kind == "billm" else STBLLM_GROUPS
        col_class = (rand(k) < 0.1).long()
        if kind == "billm":
            gid = torch.where(
                col_class.bool().unsqueeze(0), 2, torch.randint(0, 2, (n, k), generator=gen, device=dev)
            )
        else:
            kept = nm_codes(n, k, 4, 8, gen, dev) != 0
            regular = torch.randint(1, 4, (n, k), generator=gen, device=dev)
            gid = torch.where(
                col_class.bool().unsqueeze(0), torch.where(kept, 5, 4), torch.where(kept, regular, 0)
            )
        order = torch.tensor([g.order for g in groups], device=dev)
        alpha = rand(n_blocks, len(groups), 2, n) / k**0.5
        alpha = alpha * (order.view(1, -1, 1, 1) > torch.arange(2, device=dev).view(1, 1, -1, 1))
        mu = (rand(n_blocks, len(groups), n) - 0.5) * 0.2 / k**0.5 * (order > 0).view(1, -1, 1)
        return MultiBinaryWeight.from_residual(signs(2, n, k), gid, alpha, mu, groups, col_class, block)
    # pbllm
    g = group_size or k
    salient = rand(n, k) < 0.1
    codes = torch.randint(0, 256, (n, k), generator=gen, device=dev)
    s8 = (0.5 + rand(n)) * 4 / 255 / k**0.5
    z8 = torch.randint(100, 156, (n,), generator=gen, device=dev)
    return PBLLMWeight.pack(signs(n, k), table(g), table(g, -0.2, 0.2), salient, codes, s8.float(), z8)


PER_TENSOR_KINDS = ("ternary", "binary", "binary_mean", "nm2:4", "pbllm")
"""Sample kinds whose scales span the whole row; the others take groups of 128 in :func:`relabelled`."""


def relabelled(kind: str, n: int, k: int):
    """A small sample of ``kind`` as kernel arguments re-labelled as an ``n × k`` layer: what the compiler
    sees of a layer is only its dtypes and sizes, so sm_90 compiles need no full-size weight."""

    # deferred for start-up time: loads triton only when called
    from trilm.kernels.dispatch import prepare

    group = None if kind in PER_TENSOR_KINDS else 128
    kw = prepare(random_packed(kind, 256, 512, group_size=group, scale_dtype=torch.float16))
    g = k if group is None else group
    kw = dataclasses.replace(kw, n=n, k=k, group_size=g)
    if kw.affine is not None:
        kw.affine = dataclasses.replace(kw.affine, n=n, k=k, group_size=g)
    return kw
