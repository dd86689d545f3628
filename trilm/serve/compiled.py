"""Compiled prefill and decode steps: ``torch.compile`` (inductor) instead of eager, on CPU or CUDA.

A tiny model's decode step is hundreds of small ops, each paying Python and dispatch overhead; compiled,
they become a few fused C++ loops and the extern matmuls. The decode step is the bucketed static-buffer
step of :class:`~trilm.serve.graphs.DecodeGraphs` (one compiled graph per batch bucket, static shapes, its
padding rows writing to the cache's scratch position); the attention span is the one dynamic size
(``torch._dynamo.mark_dynamic``), so a bucket compiles once for every context length. The prefill step
compiles once with the prompt length dynamic (prompts of two tokens or more; a one-token prompt runs
eagerly) and the cache slot passed as a tensor, so no request triggers a recompile.

Guards: dynamo re-checks, before every call, everything the graph read — every module, parameter, packed
layer and cache tensor, thousands of checks (3.7 ms a step for a 190M model, more than the compiled step
saves). Here only the arguments are checked (the batch bucket, the span's and the prompt's length range)
plus torch's global state: the engine never swaps its model or reallocates its cache. Dynamo keeps its
compiled graphs per *code object*, shared by every instance of a class, and with the model unchecked an
engine could run another engine's graph; so each :class:`CompiledSteps` compiles its own copy of the step
functions' code.

The graph's own wrapper is C++ too (inductor's ``cpp_wrapper``): the default Python wrapper spends a few µs
per extern call and view, which at one token of a tiny model is as much as the kernels (measured here:
the 5.5M-parameter TriLM packed decoded about 1.7× as fast with it). It costs compile time (a C++ file
per graph, cached by inductor like the rest).

On CUDA the compiled decode steps are captured as CUDA graphs (``capture=True``, the engine's default
there): compiling fuses the norm, rotary, residual and SwiGLU work into a few Triton kernels around the
matrix products (each packed layer one opaque operator, ``trilm::quant_linear``), and the graph then
replays that step with one launch, as :class:`~trilm.serve.graphs.DecodeGraphs` replays the eager one.
A batch bucket compiles once, in the warm-up runs before its first capture (the span dynamic, so every
span bucket of that batch replays the same compiled code); the wrapper stays Python there, since a
replayed graph never runs it. The prefill is compiled but not captured (its length varies).

Everything compiles on first use, or up front with :meth:`CompiledSteps.warm` (server start-up). Threads:
inductor bakes ``torch.get_num_threads()`` into the code it generates, so the thread count is set before
(:func:`trilm.serve.loading.configure_threads`). When compilation fails (no C++ compiler, an unsupported
op), the steps say why once and run eagerly from then on: the eager path is the fallback and the
reference the tests compare against.
"""

from __future__ import annotations

import itertools
import logging
import types

import torch
import torch._dynamo

from trilm.infer.model import InferenceModel
from trilm.serve.cache import KVCache, PrefillStep
from trilm.serve.graphs import DecodeGraphs

log = logging.getLogger(__name__)

_ARGUMENTS = ("batch", "span_ids", "tokens", "slot")
"""The step functions' arguments: the only sources whose guards are kept."""
_instances = itertools.count()


def _argument_guards_only(entries) -> list[bool]:
    """Dynamo guard filter: keep guards on the step's arguments and on torch's global state (grad mode,
    default device...), which have no source name; drop those on ``self`` (model, cache) and globals."""
    return [e.name == "" or e.name.split("[")[0].split(".")[0] in _ARGUMENTS for e in entries]


def _own_code(method):
    """``method`` bound to its instance through a fresh copy of its code object: dynamo's cache of
    compiled graphs and its recompile limit then belong to this instance alone."""
    fn = method.__func__
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(_instances)}")
    return types.MethodType(
        types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__),
        method.__self__,
    )


class CompiledSteps(DecodeGraphs):
    """Compiled decode (per batch bucket) and prefill steps; the same logits as the eager steps within
    fp32 reassociation."""

    def __init__(self, model: InferenceModel, cache: KVCache, *, capture: bool = False):
        """``capture``: replay each decode bucket's compiled step as a CUDA graph (CUDA only)."""
        super().__init__(model, cache, capture=capture)
        options = {"guard_filter_fn": _argument_guards_only, "cpp_wrapper": not capture}
        self._decode_fn = torch.compile(_own_code(self._decode_graph), fullgraph=True, options=options)
        self._prefill_fn = torch.compile(_own_code(self._prefill_graph), fullgraph=True, options=options)
        self._limit = 64  # graphs per step function of this engine: the batch buckets and the prefill
        self._ready: set = set()  # (step function, batch) of the graphs compiled so far
        self.failure: str | None = None
        """Why compilation was given up (then every step runs eagerly), or None."""

    # -- the graphs ------------------------------------------------------------------------------------
    def _decode_graph(self, batch: int, span_ids: torch.Tensor) -> torch.Tensor:
        step = self.cache.decode(batch, span_ids.shape[0], self.write_positions[:batch])
        return self.model.forward_cached(self.tokens[:batch], self.rope_positions[:batch], step)[:, 0]

    def _prefill_graph(self, tokens: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        return self.model.forward_cached(
            tokens, length, PrefillStep(self.cache, slot, length), last_only=True
        )

    def _compiled(self, fn, *args):
        """``fn(*args)``; the first call of each graph compiles it under the settings that make its shapes
        static but for the marked dimension, and a recompile past the limit an error. Later calls skip the
        settings' context: setting dynamo's config costs tens of µs a step."""
        key = (fn, args[0] if fn is self._decode_fn else None)
        if key in self._ready:
            return fn(*args)
        with torch._dynamo.config.patch(
            automatic_dynamic_shapes=False, recompile_limit=self._limit, fail_on_recompile_limit_hit=True
        ):
            out = fn(*args)
        self._ready.add(key)
        return out

    # -- steps -------------------------------------------------------------------------------------------
    def _step(self, batch: int, span: int) -> torch.Tensor:
        if self.failure is None:
            span_ids = self.cache._span[:span]
            torch._dynamo.mark_dynamic(span_ids, 0, min=2, max=self.cache.max_len)
            try:
                return self._compiled(self._decode_fn, batch, span_ids)
            except Exception as exc:  # a compiler failure: say it once, then decode eagerly
                self._give_up(exc)
        return super()._step(batch, span)

    def _capture(self, batch: int, span: int):
        """Compile (or reuse) the bucket's graph on scratch inputs, as DecodeGraphs warms before capture;
        with ``capture``, DecodeGraphs' own warm-up runs compile it and the compiled step is captured."""
        if self.capture:
            return super()._capture(batch, span)
        self.tokens[:batch].zero_()
        self.rope_positions[:batch].zero_()
        self.write_positions[:batch].fill_(self.cache.scratch)
        self._step(batch, max(span, 2))
        return None, None

    @torch.no_grad()
    def prefill(self, prompt_ids: list[int], slot: int) -> torch.Tensor:
        """Logits [1, 1, padded_vocab] at the last prompt position; keys/values written to ``slot``."""
        tokens = torch.tensor([prompt_ids], device=self.tokens.device)
        n = len(prompt_ids)
        if self.failure is None and n >= 2:
            torch._dynamo.mark_dynamic(tokens, 1, min=2, max=self.cache.max_len)
            slot_t = torch.tensor([slot], device=tokens.device)
            try:
                return self._compiled(self._prefill_fn, tokens, slot_t)
            except Exception as exc:
                self._give_up(exc)
        return self.model.forward_cached(tokens, n, self.cache.prefill(slot, n), last_only=True)

    def _give_up(self, exc: Exception) -> None:
        self.failure = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log.warning("torch.compile failed (%s); the engine decodes eagerly", self.failure)

    @torch.no_grad()
    def warm(self) -> int:
        """Compile every batch bucket's decode step and the prefill step now (server start-up, while no
        request runs: the prefill writes two scratch tokens into the last slot), and with ``capture``
        capture every (batch, span) bucket; returns the decode steps compiled (batch buckets)."""
        if self.capture:
            self.capture_all()
        else:
            for b in self.batch_buckets:
                key = self.bucket(b, 2)
                if key not in self._graphs:
                    self._graphs[key] = self._capture(*key)
        if self.cache.max_len >= 3:  # two scratch tokens into the last slot, before any request runs
            self.prefill([0, 0], self.cache.slots - 1)
        return len(self.batch_buckets)
