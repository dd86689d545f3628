"""Loading any model trilm knows into an :class:`InferenceModel`.

Sources: whatever :func:`trilm.store.open_model` opens — a training snapshot (latent weights), a packed
snapshot (QuantLMs, packed exports), a pruned snapshot, a Hugging Face ``LlamaForCausalLM`` directory or an
exported suite checkpoint — with its weights verified there. TriLM/BiLM latent weights become their
quantized image γ·Ŵ — as float ``nn.Linear`` weights, or with ``packed=True`` as ternary/binary
``QuantLinear`` layers built from the same codes and scales — so every path computes the function the
model was trained to compute.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trilm.config import ConfigError
from trilm.formats import BinaryWeight, TernaryWeight
from trilm.infer.model import InferenceModel
from trilm.model.config import ModelConfig
from trilm.model.quant import canonical_layout, dequantize_latent, packing_scales
from trilm.model.snapshot import SnapshotMeta
from trilm.model.spec import canonical_shapes
from trilm.store.open import ModelDir, open_model


def pack_latent(cfg: ModelConfig, name: str, tensor: torch.Tensor):
    """A TriLM/BiLM block matrix as its native packed weight (ternary or binary codes + trained scales)."""

    layout = canonical_layout(cfg, name)
    if layout is None:
        raise ValueError(f"{name}: not a quantized block matrix of a {cfg.family} model")
    codes, scales, _ = packing_scales(tensor.float(), layout)
    cls = BinaryWeight if layout.fmt == "binary" else TernaryWeight
    return cls.pack(codes, scales)


def from_state_dict(
    cfg: ModelConfig,
    state: dict[str, torch.Tensor],
    packed_layers: dict | None = None,
    *,
    pack_native: bool = False,
    backend: str = "auto",
) -> InferenceModel:
    """An inference model (fp32, CPU) from canonical tensors and optional packed layers.

    ``state`` holds latent weights as a snapshot stores them; ``packed_layers`` (canonical names without
    ``.weight``) replace their float linears by ``QuantLinear``. ``pack_native`` packs TriLM/BiLM latent
    block weights as ternary/binary instead of dequantizing them.
    """
    packed_layers = dict(packed_layers or {})
    if pack_native and cfg.family != "floatlm":
        for name in list(state):
            if canonical_layout(cfg, name) is not None:
                packed_layers[name.removesuffix(".weight")] = pack_latent(cfg, name, state[name])
    expected = canonical_shapes(cfg)
    packed_names = {f"{k}.weight" for k in packed_layers}
    missing = [k for k in expected if k not in state and k not in packed_names]
    unexpected = [k for k in list(state) + sorted(packed_names) if k not in expected]
    if missing or unexpected:
        raise ConfigError(
            f"weights do not match the model config: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    model = InferenceModel(cfg)
    linears = model.linear_modules()
    float_state = {}
    for name, tensor in state.items():
        if name in packed_names:
            continue
        if tuple(tensor.shape) != expected[name]:
            raise ConfigError(
                f"{name}: shape {tuple(tensor.shape)} does not match the config's {expected[name]}"
            )
        float_state[name] = dequantize_latent(cfg, name, tensor.float())
    if packed_layers:
        # deferred for start-up time: loads triton only when called
        from trilm.kernels import QuantLinear

        for name, weight in packed_layers.items():
            full = f"{name}.weight"
            if full not in linears:
                raise ConfigError(f"{name}: packed layer is not a block linear of this model")
            if tuple(weight.shape) != expected[full]:
                raise ConfigError(
                    f"{name}: packed shape {tuple(weight.shape)} does not match {expected[full]}"
                )
            model.set_linear(full, QuantLinear(weight, backend=backend))
    model.load_state_dict(float_state, strict=False)
    return model


def load_inference_model(
    path: str | Path | ModelDir,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    packed: bool = False,
    backend: str = "auto",
) -> InferenceModel:
    """Load a model directory (a path, or one already opened by :func:`trilm.store.open_model`).

    ``dtype`` applies to the float parameters (embedding, norms, head, float linears); packed layers keep
    their stored tensors. ``packed=True`` serves a TriLM/BiLM snapshot through ternary/binary kernels.
    The model is in eval mode and its weights do not require gradients.
    """
    model, _ = load_with_meta(path, packed=packed, backend=backend)
    return prepare_for_inference(model, device=device, dtype=dtype)


def load_with_meta(
    path: str | Path | ModelDir, *, packed: bool = False, backend: str = "auto"
) -> tuple[InferenceModel, SnapshotMeta]:
    """(fp32 CPU model, its snapshot metadata); an HF directory's meta says what it records of itself."""
    opened = path if isinstance(path, ModelDir) else open_model(path)
    weights = opened.weights
    model = from_state_dict(
        opened.config, weights.float_state(), weights.packed_layers(), pack_native=packed, backend=backend
    )
    if opened is not path:
        weights.release()
    return model, opened.meta


def prepare_for_inference(
    model: InferenceModel, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> InferenceModel:
    """Move to ``device``, cast float parameters (not packed buffers) to ``dtype``, eval, no grads."""
    model = model.to(device)
    for p in model.parameters():  # packed layers hold buffers only, so their stored tensors stay as they are
        p.data = p.data.to(dtype)
        p.requires_grad_(False)
    return model.eval()
