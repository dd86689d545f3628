"""trilm: pretraining, analysis and serving of ternary (TriLM), binary (BiLM) and float (FloatLM) LMs."""

import warnings

# megatron-core warns at import that NVIDIA's optional fused kernels are absent; trilm does not use them.
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")

__version__ = "0.1.0"
