"""trilm's lm-evaluation-harness model, registered as ``--model trilm``.

It evaluates any model :func:`trilm.eval.model.load_eval_model` opens (snapshot, packed snapshot/QuantLM,
Hugging Face directory) with the tokenization it was trained with: no BOS (unless the run prepended one),
and EOS as the token a context-free text is conditioned on (``prefix_token_id``), which is what precedes
every document in training. lm-eval's ``hf`` model gives the same numbers on an HF export when told the
same prefix: ``--model hf --model_args pretrained=DIR,prefix_token_id=<eos id>`` (2 for trilm tokenizers).

All three request types are batched. ``loglikelihood`` scores (context, continuation) pairs, longest first,
truncating the context on the left to the model's context like lm-eval's ``hf`` model does;
``loglikelihood_rolling`` cuts a document into disjoint windows with lm-eval's own window utilities; and
``generate_until`` decodes greedily, a batch at a time (right-padded: with causal attention and no cache,
each row's next token is read at its own last position), stopping at EOS or any ``until`` string.

Model arguments (``--model_args``): ``pretrained`` (path), ``device``, ``dtype`` (float32, bfloat16,
float16), ``batch_size``, ``max_length``, ``tokenizer`` (a tokenizer.model when none is next to the model),
``packed`` (run TriLM/BiLM block linears as packed ternary/binary layers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator
from tqdm import tqdm

from trilm.config import ConfigError
from trilm.dtypes import parse_dtype
from trilm.eval.model import EvalModel, load_eval_model


def _bool(value) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")


@register_model("trilm")
class TrilmLM(TemplateLM):
    """lm-eval model over a trilm :class:`~trilm.eval.model.EvalModel`."""

    def __init__(
        self,
        pretrained: str | EvalModel | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int | str = 8,
        max_length: int | None = None,
        tokenizer: str | None = None,
        packed: bool | str = False,
        max_gen_toks: int = 256,
        **_ignored,
    ) -> None:
        super().__init__()
        if isinstance(pretrained, EvalModel):
            self.em = pretrained
        elif pretrained:
            self.em = load_eval_model(
                pretrained,
                device=device,
                dtype=parse_dtype(dtype),
                tokenizer=tokenizer,
                packed=_bool(packed),
            )
        else:
            raise ConfigError("the trilm lm-eval model needs pretrained=PATH (a snapshot or HF directory)")
        if self.em.tokenizer is None:
            raise ConfigError(f"{self.em.path}: no tokenizer.model next to the model; pass tokenizer=PATH")
        self.tok = self.em.tokenizer
        self._device = self.em.device
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        self._max_length = int(max_length) if max_length else self.em.context
        self.max_gen_toks = int(max_gen_toks)

    # -- tokenization --------------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.em.prefix_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return f"trilm-{self.tok.hash[:16]}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        ids = self.tok.encode(string)
        bos = self.em.add_bos and add_special_tokens is not False
        return [self.tok.bos_id, *ids] if bos else ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tok.decode([t for t in tokens if t < self.tok.vocab_size])

    # -- log-likelihoods -----------------------------------------------------------------------------------
    def _loglikelihood_tokens(
        self, requests, disable_tqdm: bool = False, **kwargs
    ) -> list[tuple[float, bool]]:
        """``((context, continuation), context_ids, continuation_ids)`` → (Σ log p(continuation), greedy?)."""

        def key(req):
            tokens = req[1] + req[2]
            return -len(tokens), tuple(tokens)

        collator = Collator(requests, sort_fn=key)
        results: list[tuple[float, bool]] = []
        bar = tqdm(total=len(requests), disable=disable_tqdm or len(requests) < 2, desc="loglikelihood")
        for batch in collator.get_batched(n=self.batch_size):
            windows, spans = [], []
            for _, ctx, cont in batch:
                if not cont:
                    raise ConfigError("lm-eval asked for the log-likelihood of an empty continuation")
                full = (ctx + cont)[-(self.max_length + 1) :]
                windows.append(full[:-1])
                spans.append(len(cont))
            width = max(len(w) for w in windows)
            ids = torch.full((len(windows), width), self.eot_token_id, dtype=torch.long)
            for row, window in enumerate(windows):
                ids[row, : len(window)] = torch.tensor(window)
            logprobs = F.log_softmax(self.em.logits(ids), dim=-1).cpu()
            for row, ((_, _, cont), n) in enumerate(zip(batch, spans)):
                end = len(windows[row])
                lp = logprobs[row, end - n : end]
                target = torch.tensor(cont[-n:])
                value = float(lp.gather(-1, target[:, None]).sum())
                greedy = bool((lp.argmax(-1) == target).all())
                results.append((value, greedy))
                self.cache_hook.add_partial("loglikelihood", batch[row][0], (value, greedy))
            bar.update(len(batch))
        bar.close()
        return collator.get_original(results)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Σ log p(document) over disjoint windows of the context length (one document per request)."""
        windows, owners = [], []
        for index, (text,) in enumerate(req.args for req in requests):
            rolling = lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(text, add_special_tokens=False),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for ctx, cont in map(lm_utils.make_disjoint_window, rolling):
                windows.append(((None, None), ctx, cont))
                owners.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for owner, (value, _) in zip(owners, scores):
            totals[owner] += value
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation ----------------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, stopped at EOS or the first ``until`` string (which is cut off)."""
        items = [(req.args[0], dict(req.args[1] or {})) for req in requests]
        collator = Collator(
            items,
            sort_fn=lambda x: (-len(self.tok_encode(x[0])), x[0]),
            group_fn=lambda x: repr(sorted(x[1].items())),
            group_by="gen_kwargs",
        )
        out: list[str] = []
        bar = tqdm(total=len(items), disable=disable_tqdm or len(items) < 2, desc="generate_until")
        for batch in collator.get_batched(n=self.batch_size):
            kwargs = batch[0][1]
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            if kwargs.get("do_sample") and float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                raise ConfigError(
                    "the trilm lm-eval model generates greedily; do_sample with a temperature > 0"
                )
            texts = self._greedy([ctx for ctx, _ in batch], until, max_new)
            for (ctx, _), text in zip(batch, texts):
                out.append(text)
                self.cache_hook.add_partial("generate_until", (ctx, kwargs), text)
            bar.update(len(batch))
        bar.close()
        return collator.get_original(out)

    @torch.no_grad()
    def _greedy(self, contexts: list[str], until: list[str], max_new: int) -> list[str]:
        keep = max(self.max_length - max_new, 1)
        prompts = [self.tok_encode(c)[-keep:] for c in contexts]
        lengths = [len(p) for p in prompts]
        width = max(lengths) + max_new
        ids = torch.full((len(prompts), width), self.eot_token_id, dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, : len(p)] = torch.tensor(p)
        generated: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        vocab = self.tok.vocab_size
        for _ in range(max_new):
            end = max(lengths)
            logits = self.em.logits(ids[:, :end])
            for row in range(len(prompts)):
                if done[row]:
                    continue
                nxt = int(logits[row, lengths[row] - 1, :vocab].argmax())
                if nxt == self.eot_token_id:
                    done[row] = True
                    continue
                generated[row].append(nxt)
                ids[row, lengths[row]] = nxt
                lengths[row] += 1
                text = self.tok_decode(generated[row])
                if any(s and s in text for s in until):
                    done[row] = True
            if all(done):
                break
        texts = []
        for tokens in generated:
            text = self.tok_decode(tokens)
            for stop in until:
                if stop:
                    text = text.split(stop)[0]
            texts.append(text)
        return texts
