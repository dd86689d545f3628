"""The papers' nominal bits/weight formulas: defined once in :mod:`trilm.bits`, re-exported for the codec.

The method papers count bits differently from what a file holds (scales, zeros, masks, indices): these
functions reproduce their numbers so a results table can show both "value bits" (the paper's) and
``PackedWeight.bits_per_weight()`` (bytes on disk / N·K).
"""

from trilm.bits import billm_bits, billm_storing_bits, gptq_bits, pbllm_bits, stbllm_bits

__all__ = ["billm_bits", "billm_storing_bits", "gptq_bits", "pbllm_bits", "stbllm_bits"]
