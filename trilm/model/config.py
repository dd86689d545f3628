"""Model configuration and the named presets (the nine Spectra sizes per family, plus tiny CPU sizes)."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Literal

from trilm.config import Config, ConfigError, require
from trilm.families import FAMILIES, FAMILY_NAMES, WeightFormat

if TYPE_CHECKING:  # the names are the registry's, known at run time only: a type checker sees a str
    Family = str
else:
    Family = Literal[FAMILY_NAMES]  # the registry's names (trilm.families), checked when a config is read


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """The sizes of one block: query heads, KV heads and FFN width (0 = that sub-block is absent)."""

    heads: int
    kv_heads: int
    ffn: int


_GROUP_RE = re.compile(r"^(shard|tensor|row|group:(\d+))$")


@dataclasses.dataclass
class QuantConfig(Config):
    """How the block linears are fake-quantized during training (ignored for FloatLM).

    ``scale_group`` decides which weights share one absmean scale:
    ``shard`` (TriLM: one per tensor-parallel partition of each matrix), ``tensor`` (BitNet b1.58),
    ``row`` (one per output row) or ``group:g`` (g consecutive input weights of a row).
    """

    scale_group: str = "shard"
    partitions: int = 0
    """Partitions the ``shard`` scales are computed over; 0 = the tensor-parallel degree of the run that
    builds the model. A checkpoint stores the resolved value, so a TP=2-trained TriLM loaded at TP=1 keeps
    its two scales per matrix."""
    eps: float = 1e-6
    """γ = eps + mean|W| keeps the scale positive for an all-zero group."""
    activation_bits: int | None = None
    """8 → per-token absmax int8 fake-quant of linear inputs (BitNet b1.58); None = float activations."""

    def validate(self) -> None:
        match = _GROUP_RE.match(self.scale_group)
        require(
            match is not None,
            f"scale_group: {self.scale_group!r} is not one of shard, tensor, row, group:<size>",
        )
        if match and match.group(2) is not None:
            require(int(match.group(2)) > 0, f"scale_group: group size must be > 0 in {self.scale_group!r}")
        require(self.partitions >= 0, f"partitions: must be >= 0, got {self.partitions}")
        require(self.eps >= 0, f"eps: must be >= 0, got {self.eps}")
        require(
            self.activation_bits in (None, 8),
            f"activation_bits: only 8 (or null: float activations) is supported, got {self.activation_bits}",
        )

    @property
    def group_size(self) -> int | None:
        return int(self.scale_group.split(":")[1]) if self.scale_group.startswith("group:") else None


ROPE_TYPES = ("linear", "llama3")


@dataclasses.dataclass
class RopeScaling(Config):
    """RoPE frequency scaling of a long-context Llama, in Hugging Face's ``rope_scaling`` terms.

    ``linear`` (position interpolation) divides every rotary frequency by ``factor``. ``llama3`` (Llama 3.1
    and 3.2) divides only the low frequencies — wavelengths longer than ``original_max_position_embeddings /
    low_freq_factor`` — keeps those shorter than ``original_max_position_embeddings / high_freq_factor`` and
    interpolates in between. The attention scale is unchanged in both (:func:`trilm.model.ops.rope_inv_freq`).
    """

    rope_type: str = "linear"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def validate(self) -> None:
        require(
            self.rope_type in ROPE_TYPES,
            f"rope_type: {self.rope_type!r} is not supported (trilm implements {', '.join(ROPE_TYPES)})",
        )
        require(self.factor > 0, f"factor: must be > 0, got {self.factor}")
        if self.rope_type == "llama3":
            require(
                self.high_freq_factor > self.low_freq_factor > 0,
                f"high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor "
                f"({self.low_freq_factor}) > 0",
            )
            require(
                self.original_max_position_embeddings > 0,
                f"original_max_position_embeddings: must be > 0, got {self.original_max_position_embeddings}",
            )


@dataclasses.dataclass
class ModelConfig(Config):
    """A LLaMA-style decoder: pre-norm RMSNorm, RoPE, SwiGLU, no biases.

    The LM head is its own tensor (``head.weight``); a model imported with tied embeddings carries a copy
    of the embedding there, and its snapshot records the tie (``meta.extra["tied_embeddings"]``) so exports
    can tie them again (:mod:`trilm.model.hf`)."""

    family: Family = "trilm"
    name: str = "custom"
    vocab_size: int = 50304
    """Tokenizer vocabulary; the embedding is padded up to a multiple of ``pad_vocab_to``."""
    pad_vocab_to: int = 128
    hidden: int = 512
    ffn: int = 1280
    heads: int = 8
    kv_heads: int | None = None
    """Grouped-query attention when smaller than ``heads``; None = multi-head attention."""
    layers: int = 16
    context: int = 2048
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    """Long-context RoPE scaling (``linear``, ``llama3``) of an imported model; None = plain RoPE."""
    explicit_head_dim: int | None = None
    """Long-context RoPE scaling (``linear``, ``llama3``) of an imported model; None: plain RoPE."""
    norm_eps: float = 1e-5
    init_std: float = 0.02
    """Normal init std; output projections use init_std / sqrt(2·layers) (GPT-2/Megatron scaled init)."""
    mup_base_width: int = 0
    """μP (the maximal-update parametrization of Tensor Programs V, for Adam) relative to this width; 0 = the
    standard parametrization. With m = hidden / mup_base_width, the block matrices start at init std /
    sqrt(m) and train at learning rate / m, the LM head starts at init std / m and trains at learning
    rate / m; the embedding and the norm gains keep both. The forward pass is unchanged (no multipliers), so
    exports and inference do not know about it; at hidden == mup_base_width it is the standard
    parametrization exactly. Its point: the best learning rate found at the base width carries over."""
    quant: QuantConfig = dataclasses.field(default_factory=QuantConfig)
    layer_kv_heads: list[int] | None = None
    """Per-layer KV-head counts of a structurally pruned model (None = ``kv_heads`` in every layer). Query
    heads of a layer are its KV heads times the global GQA group ``heads // kv_heads``; 0 removes the
    attention sub-block (the residual passes through)."""
    layer_ffn: list[int] | None = None
    """Per-layer FFN widths of a pruned model (None = ``ffn`` everywhere); 0 removes the MLP sub-block."""

    def validate(self) -> None:
        for key in ("vocab_size", "pad_vocab_to", "hidden", "ffn", "heads", "layers", "context"):
            value = getattr(self, key)
            require(value > 0, f"{key}: must be > 0, got {value}")
        if self.explicit_head_dim is None:
            require(
                self.hidden % self.heads == 0,
                f"hidden: {self.hidden} is not divisible by heads={self.heads}",
            )
        else:
            require(
                self.explicit_head_dim > 0, f"explicit_head_dim: must be > 0, got {self.explicit_head_dim}"
            )
        require(self.head_dim % 2 == 0, f"hidden: head dim {self.head_dim} must be even for RoPE")
        kv = self.num_kv_heads
        require(kv > 0, f"kv_heads: must be > 0, got {kv}")
        require(self.heads % kv == 0, f"kv_heads: heads={self.heads} is not divisible by kv_heads={kv}")
        require(self.rope_theta > 0, f"rope_theta: must be > 0, got {self.rope_theta}")
        require(
            self.mup_base_width >= 0, f"mup_base_width: must be >= 0 (0 = off), got {self.mup_base_width}"
        )
        for key in ("layer_kv_heads", "layer_ffn"):
            values = getattr(self, key)
            if values is None:
                continue
            require(
                len(values) == self.layers,
                f"{key}: has {len(values)} entries but the model has layers={self.layers}",
            )
            for i, v in enumerate(values):
                require(v >= 0, f"{key}[{i}]: must be >= 0, got {v}")
        if self.layer_kv_heads is not None:
            for i, v in enumerate(self.layer_kv_heads):
                require(
                    v <= kv,
                    f"layer_kv_heads[{i}]: {v} exceeds kv_heads={kv} (pruning only removes heads)",
                )
        group = self.quant.group_size
        if group is not None and self.family != "floatlm":
            dims = [("hidden", self.hidden)] + [
                (f"ffn of layer {i}", s.ffn) for i, s in enumerate(self.layer_shapes()) if s.ffn
            ]
            for key, dim in dims:
                require(
                    dim % group == 0,
                    f"quant.scale_group: group size {group} does not divide {key}={dim}",
                )

    def layer_shape(self, index: int) -> LayerShape:
        """Heads, KV heads and FFN width of block ``index`` (per-layer for pruned models)."""
        kv = self.num_kv_heads if self.layer_kv_heads is None else self.layer_kv_heads[index]
        ffn = self.ffn if self.layer_ffn is None else self.layer_ffn[index]
        return LayerShape(heads=kv * (self.heads // self.num_kv_heads), kv_heads=kv, ffn=ffn)

    def layer_shapes(self) -> list[LayerShape]:
        return [self.layer_shape(i) for i in range(self.layers)]

    @property
    def is_uniform(self) -> bool:
        """Every block has the global head count and FFN width (what Hugging Face's LLaMA can express)."""
        full = LayerShape(self.heads, self.num_kv_heads, self.ffn)
        return all(s == full for s in self.layer_shapes())

    @property
    def size_name(self) -> str:
        """The family-free size name (``trilm-1.1b`` → ``1.1b``): rows of one size pair across families."""
        prefix = f"{self.family}-"
        return self.name[len(prefix) :] if self.name.startswith(prefix) else self.name

    @property
    def width_multiplier(self) -> float:
        """m = hidden / mup_base_width under μP; 1 in the standard parametrization."""
        return self.hidden / self.mup_base_width if self.mup_base_width else 1.0

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim if self.explicit_head_dim is not None else self.hidden // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def padded_vocab(self) -> int:
        m = self.pad_vocab_to
        return (self.vocab_size + m - 1) // m * m

    @property
    def weight_format(self) -> WeightFormat:
        return FAMILIES[self.family].weight_format

    def check_tensor_parallel(self, tp: int) -> None:
        """Raise ConfigError when ``tp`` cannot split this model evenly (checked before building)."""
        checks = [
            ("heads", self.heads),
            ("kv_heads", self.num_kv_heads),
            ("ffn", self.ffn),
            ("vocab (padded)", self.padded_vocab),
        ]
        if not self.is_uniform:
            for i, shape in enumerate(self.layer_shapes()):
                checks += [(f"layer_kv_heads[{i}]", shape.kv_heads), (f"layer_ffn[{i}]", shape.ffn)]
        for key, value in checks:
            require(value % tp == 0, f"parallel.tensor_parallel={tp} does not divide model.{key}={value}")
        parts = self.scale_partitions(tp)
        if self.family != "floatlm" and self.quant.scale_group == "shard":
            require(
                parts % tp == 0 or tp % parts == 0,
                f"model.quant.partitions={parts} and parallel.tensor_parallel={tp} must divide one another",
            )
            sizes = [("heads", self.heads), ("kv_heads", self.num_kv_heads), ("ffn", self.ffn)]
            if not self.is_uniform:
                for i, shape in enumerate(self.layer_shapes()):
                    sizes += [(f"layer_kv_heads[{i}]", shape.kv_heads), (f"layer_ffn[{i}]", shape.ffn)]
            for key, value in sizes:
                require(
                    value % parts == 0,
                    f"model.quant.partitions={parts} does not divide model.{key}={value}",
                )
        group = self.quant.group_size
        if group is not None and self.family != "floatlm":
            for key, dim in (
                ("hidden", self.hidden),
                *((f"ffn[{i}]", s.ffn) for i, s in enumerate(self.layer_shapes())),
            ):
                require(
                    (dim // tp) % group == 0,
                    f"model.quant.scale_group: group {group} does not divide the TP={tp} shard of {key}",
                )

    def scale_partitions(self, tp: int) -> int:
        return self.quant.partitions or tp

    def resolved(self, tp: int) -> ModelConfig:
        """This config with ``quant.partitions`` fixed to what a TP=``tp`` build uses (saved with it)."""
        if self.family == "floatlm" or self.quant.partitions:
            return self
        return self.replace(quant=self.quant.replace(partitions=tp))


# (hidden, ffn, heads, layers, training MP degree) from the Spectra suite README.
SPECTRA_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "99m": (512, 1280, 8, 16, 1),
    "190m": (768, 2048, 12, 16, 1),
    "390m": (1024, 2560, 16, 24, 1),
    "560m": (1280, 3072, 20, 24, 1),
    "830m": (1536, 4096, 24, 24, 1),
    "1.1b": (1792, 5120, 28, 24, 2),
    "1.5b": (2048, 6144, 32, 24, 2),
    "2.4b": (2304, 7680, 36, 30, 3),
    "3.9b": (3072, 9216, 24, 30, 6),
}
# Reported total parameter counts (Spectra README), used by tests of the counting function.
SPECTRA_PARAMS: dict[str, float] = {
    "99m": 99.74e6,
    "190m": 190.0e6,
    "390m": 392.4e6,
    "560m": 569.2e6,
    "830m": 834.0e6,
    "1.1b": 1.149e9,
    "1.5b": 1.515e9,
    "2.4b": 2.461e9,
    "3.9b": 3.989e9,
}
# Tiny sizes that train on a CPU in minutes: (hidden, ffn, heads, layers, context).
TINY_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "nano": (64, 192, 4, 2, 128),
    "tiny": (128, 384, 4, 4, 256),
    "micro": (192, 512, 6, 4, 256),
    "small": (256, 768, 8, 6, 256),
}


# Llama models trilm imports, by the shapes of their linears: (hidden, ffn, heads, kv_heads, head_dim).
IMPORTED_SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "smollm2-135m": (576, 1536, 9, 3, 64),
    "llama-2-7b": (4096, 11008, 32, 32, 128),
    "llama-3-8b": (4096, 14336, 32, 8, 128),
}


def decode_linear_shapes() -> list[tuple[str, int, int]]:
    """(label, N, K) of every distinct linear of a decode step — fused Q/K/V, o, fused gate/up, down, as
    :func:`trilm.infer.fuse_projections` stacks them — for the nine Spectra sizes and the imported Llama
    models: the layer shapes the kernels' launch plans are judged at (:mod:`trilm.kernels.launch_plans`)."""
    models = {
        f"spectra-{s}": (h, f, heads, heads, h // heads) for s, (h, f, heads, _, _) in SPECTRA_SIZES.items()
    }
    models.update(IMPORTED_SHAPES)
    out = []
    for name, (hidden, ffn, heads, kv, hd) in models.items():
        out += [
            (f"{name} qkv", (heads + 2 * kv) * hd, hidden),
            (f"{name} o", hidden, heads * hd),
            (f"{name} gate_up", 2 * ffn, hidden),
            (f"{name} down", hidden, ffn),
        ]
    return out


def preset_names() -> list[str]:
    sizes = [*SPECTRA_SIZES, *TINY_SIZES]
    return [f"{family}-{size}" for family in FAMILY_NAMES for size in sizes]


def training_partitions(preset: str) -> int:
    """The tensor-parallel degree Spectra trained a size with (its TriLM scale partitions)."""
    _, size = preset.split("-", 1)
    return SPECTRA_SIZES[size][4] if size in SPECTRA_SIZES else 1


def preset(name: str, **overrides) -> ModelConfig:
    """``preset("trilm-1.1b")``: a named size of a family; keyword overrides replace top-level fields."""
    if not isinstance(name, str):
        raise ConfigError(f"preset: expected a name such as trilm-tiny, got {name!r}")
    family, _, size = name.partition("-")
    if family not in FAMILIES or not size:
        raise ConfigError(
            f"unknown preset {name!r}: expected <family>-<size>, family in {list(FAMILY_NAMES)}"
        )
    if size in SPECTRA_SIZES:
        hidden, ffn, heads, layers, _mp = SPECTRA_SIZES[size]
        fields: dict[str, Any] = dict(
            hidden=hidden, ffn=ffn, heads=heads, layers=layers, context=2048, vocab_size=50304
        )
    elif size in TINY_SIZES:
        hidden, ffn, heads, layers, context = TINY_SIZES[size]
        fields = dict(hidden=hidden, ffn=ffn, heads=heads, layers=layers, context=context, vocab_size=4096)
    else:
        known = ", ".join([*SPECTRA_SIZES, *TINY_SIZES])
        raise ConfigError(f"unknown preset size {size!r} in {name!r}; sizes: {known}")
    fields.update(family=family, name=name)
    fields.update(overrides)
    return ModelConfig(**fields)
