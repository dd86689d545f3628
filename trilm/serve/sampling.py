"""Per-request sampling parameters and the batched sampler.

Every row of a decode batch carries its own parameters. Greedy rows take the argmax; sampling rows apply,
in this order (Hugging Face's order of logits warpers), temperature, top-k and top-p (nucleus),
then draw by inverse CDF with **one uniform number from the request's own generator**. A seeded request
therefore produces the same tokens whatever else shares its batch, and unseeded requests get a fresh
random seed. Ids at and beyond the tokenizer's vocabulary (the embedding's padding rows) are cut off before
anything else, so they can never be produced.
"""

from __future__ import annotations

import dataclasses
import math
import secrets

import torch


class SamplingError(ValueError):
    """An invalid sampling parameter; the message names the field."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded.

    ``temperature`` 0 is greedy. ``top_k`` 0 and ``top_p`` 1 switch those filters off. Generation ends
    after ``max_tokens`` new tokens, at the tokenizer's EOS (unless ``ignore_eos``), at any id of
    ``stop_token_ids``, or where the text contains one of ``stop`` (the stop string is not returned).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check_int("max_tokens", self.max_tokens, low=1)
        _check_int("top_k", self.top_k, low=0)
        if self.seed is not None:
            _check_int("seed", self.seed)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise SamplingError(f"temperature: must be a finite number >= 0, got {t!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not (0 < p <= 1):
            raise SamplingError(f"top_p: must be in (0, 1], got {p!r}")
        for i, s in enumerate(self.stop):
            if not isinstance(s, str) or not s:
                raise SamplingError(f"stop[{i}]: must be a non-empty string, got {s!r}")
        for i, t_id in enumerate(self.stop_token_ids):
            _check_int(f"stop_token_ids[{i}]", t_id, low=0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check_int(name: str, value, low: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingError(f"{name}: must be an integer, got {value!r}")
    if low is not None and value < low:
        raise SamplingError(f"{name}: must be >= {low}, got {value}")


def make_generator(seed: int | None) -> torch.Generator:
    """The request's own CPU generator (seeded, or from a fresh random seed)."""
    seed = secrets.randbits(63) if seed is None else seed % 2**64
    return torch.Generator(device="cpu").manual_seed(seed)


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    vocab_size: int,
) -> list[int]:
    """One token per row of ``logits`` [n, ≥vocab_size] under each row's parameters."""
    logits = logits[:, :vocab_size].float()
    tokens = logits.argmax(-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        picked = _sample_rows(logits[rows], [params[i] for i in rows], [generators[i] for i in rows])
        tokens[torch.tensor(rows, device=tokens.device)] = picked
    return tokens.tolist()


def _sample_rows(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> torch.Tensor:
    vocab = logits.shape[1]
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device, dtype=torch.float32)
    logits = logits / temps[:, None]
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    k_max = max(ks)
    filtered = k_max < vocab or any(p.top_p < 1 for p in params)
    if filtered:
        # candidates sorted by logit: the top-k_max are enough for every row's top-k and its nucleus
        values, order = torch.topk(logits, k_max, dim=-1) if k_max < vocab else logits.sort(-1, True)
        rank = torch.arange(values.shape[1], device=device)
        values = values.masked_fill(rank[None] >= torch.tensor(ks, device=device)[:, None], float("-inf"))
        probs = torch.softmax(values, -1)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
        outside = (probs.cumsum(-1) - probs) >= top_p[:, None]  # keeps the smallest set with mass ≥ top_p
        outside[:, 0] = False
        probs = probs.masked_fill(outside, 0.0)
    else:
        probs = torch.softmax(logits, -1)
    cdf = probs.cumsum(-1)
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(device)
    # first index whose cumulative mass exceeds u·total: never an entry of zero probability
    choice = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    over = choice >= cdf.shape[1]  # u·total rounded up to the total
    if bool(over.any()):
        last_live = cdf.shape[1] - 1 - (probs > 0).flip(-1).int().argmax(-1)
        choice = torch.where(over, last_live, choice)
    return order.gather(1, choice[:, None]).squeeze(1) if filtered else choice
