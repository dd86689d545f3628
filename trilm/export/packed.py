"""``trilm export packed``: block linears as packed codes + scales, a packed snapshot any trilm tool loads.

A TriLM's matrices become :class:`~trilm.formats.TernaryWeight` (2-bit codes, one scale per tensor-parallel
partition — per output-row block for q/k/v/gate/up, per input-column block for o/down — exactly the
trained γ), a BiLM's :class:`~trilm.formats.BinaryWeight`; a QuantLM's packed layers pass through as they
are. Everything goes through the one packing codec (:mod:`trilm.formats`) and the packed-snapshot writer
(:func:`trilm.store.snapshot.write_snapshot_files`), so ``trilm.infer.load_inference_model``, the kernels,
``trilm eval`` and the server read the result directly. The float tensors (embedding, norms, LM head) are
stored in fp16 by default.

The export checks itself: the packed model's logits are compared with the source's (same float dtype)
before the directory is renamed into place. The report gives the bytes on disk against the same model in
fp16 and the stored bits per linear weight.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from trilm.bits import stored_linear_bits
from trilm.config import ConfigError
from trilm.dtypes import parse_dtype
from trilm.export.card import write_model_card
from trilm.export.common import export_directory, open_source, portable
from trilm.infer import load_inference_model, pack_latent
from trilm.model.flops import parameter_counts
from trilm.model.quant import canonical_layout
from trilm.model.snapshot import SnapshotMeta
from trilm.store.layout import PACKED_FILE, WEIGHTS_FILE
from trilm.store.open import ModelDir
from trilm.store.snapshot import write_snapshot_files


@dataclasses.dataclass
class PackedReport:
    path: Path
    bytes: int
    fp16_bytes: int
    linear_bits: float
    max_logit_error: float

    def summary(self) -> str:
        return (
            f"wrote {self.path}: {self.bytes / 2**20:.2f} MiB on disk vs {self.fp16_bytes / 2**20:.2f} MiB "
            f"in fp16 ({self.bytes / self.fp16_bytes:.3f}×), block linears at {self.linear_bits:.3f} stored "
            f"bits/weight; packed logits differ from the snapshot's by at most {self.max_logit_error:.2e}"
        )


def packed_layers_of(src: ModelDir) -> tuple[dict[str, torch.Tensor], dict]:
    """(float tensors, packed layers) of a model: native packing of TriLM/BiLM latents, or its own."""

    state = src.weights.float_state()
    existing = src.weights.packed_layers()
    if existing:
        return state, existing
    if src.config.family == "floatlm":
        raise ConfigError(
            f"{src.path}: a FloatLM has no ternary/binary codes to pack; quantize it first (a QuantLM is a "
            "packed snapshot already) or export it as hf/gguf"
        )
    packed, floats = {}, {}
    for name, tensor in state.items():
        if canonical_layout(src.config, name) is None:
            floats[name] = tensor
        else:
            packed[name.removesuffix(".weight")] = pack_latent(src.config, name, tensor)
    return floats, packed


@torch.no_grad()
def _max_logit_error(source: ModelDir, packed: Path, cfg, float_dtype: torch.dtype) -> tuple[float, float]:
    """(max |packed − source| logit, max |source| logit) on fixed random ids, floats cast alike."""

    ids = torch.randint(
        0, cfg.vocab_size, (2, min(cfg.context, 32)), generator=torch.Generator().manual_seed(0)
    )
    reference = load_inference_model(source)
    linears = {id(getattr(m, "weight", None)) for m in reference.linear_modules().values()}
    for p in reference.parameters():  # embedding, norms, head as the export stores them
        if id(p) not in linears:
            p.data = p.data.to(float_dtype).float()
    want = reference(ids).float()
    got = load_inference_model(packed)(ids).float()
    return float((got - want).abs().max()), float(want.abs().max())


def export_snapshot_packed(
    snapshot: str | Path,
    out: str | Path,
    *,
    dtype: str = "float16",
    tokenizer: str | Path | None = None,
    src: ModelDir | None = None,
    tolerance: float = 1e-4,
) -> PackedReport:
    """Write the packed export of a model (atomically) and check it against the source."""
    float_dtype = parse_dtype(dtype, "--dtype")
    src = src or open_source(snapshot, tokenizer=tokenizer)
    floats, packed = packed_layers_of(src)
    floats = {k: v.to(float_dtype) for k, v in floats.items()}
    meta = SnapshotMeta.from_dict(portable(src.meta.to_dict()))
    meta.extra = {**meta.extra, "packed_from": src.label}
    if src.add_bos:
        meta.extra["add_bos"] = True
    with export_directory(out, "packed", src, dtype=dtype) as tmp:
        write_snapshot_files(tmp, src.config, meta, floats, packed, tokenizer=src.tokenizer.path)
        error, size = _max_logit_error(src, tmp, src.config, float_dtype)
        if not error <= tolerance * max(1.0, size):
            raise ConfigError(f"{src.given}: the packed export's logits differ by {error:.3g}; not written")
        write_model_card(
            tmp, src, files={"float tensors": f"{WEIGHTS_FILE} ({dtype})", "packed": PACKED_FILE}
        )
    out = Path(out)
    counts = parameter_counts(src.config)
    return PackedReport(
        path=out,
        bytes=(out / WEIGHTS_FILE).stat().st_size + (out / PACKED_FILE).stat().st_size,
        fp16_bytes=2 * counts.total,
        linear_bits=stored_linear_bits(packed),
        max_logit_error=error,
    )
