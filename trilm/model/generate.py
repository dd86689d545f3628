"""Plain autoregressive sampling for demos and quick checks (no KV cache; the serving engine has one).

Recomputing the whole window each token costs O(n²) but needs nothing beyond ``model(input_ids)``, which
keeps it correct for every family and tensor-parallel layout; for the tiny quickstart models it is instant.
"""

from __future__ import annotations

import torch

from trilm.model.transformer import Decoder


@torch.no_grad()
def generate(
    model: Decoder,
    prompt_ids: list[int],
    max_new_tokens: int = 64,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 0,
    stop_id: int | None = None,
    vocab_size: int | None = None,
) -> list[int]:
    """Token ids continuing ``prompt_ids``; temperature 0 is greedy. Padding ids beyond ``vocab_size``
    (the tokenizer's real vocabulary) are never sampled."""
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = list(prompt_ids)
    context = model.cfg.context
    for _ in range(max_new_tokens):
        window = torch.tensor([ids[-context:]], device=device)
        logits = model(window)[0, -1].float().cpu()
        if vocab_size is not None:
            logits = logits[:vocab_size]
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        ids.append(nxt)
        if stop_id is not None and nxt == stop_id:
            break
    return ids[len(prompt_ids) :]
