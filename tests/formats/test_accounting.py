"""The papers' nominal bit counts (posthoc.md): GPTQ 4.156 / 3.148, PB-LLM 2.7, BiLLM 1.1, STBLLM 0.55."""

import pytest

from trilm.formats import billm_bits, billm_storing_bits, gptq_bits, pbllm_bits, stbllm_bits


def test_paper_bit_counts():
    assert gptq_bits(4, 128) == pytest.approx(4.156, abs=5e-4)
    assert gptq_bits(3, 128) == pytest.approx(3.148, abs=5e-4)
    assert gptq_bits(4, None) == 4.0
    assert pbllm_bits(0.1) == pytest.approx(2.7)
    assert billm_bits(0.1) == pytest.approx(1.1)
    assert billm_storing_bits(128) == pytest.approx(1 + 1 / 128)
    assert stbllm_bits(0.1, 4, 8) == pytest.approx(0.55)
    with pytest.raises(ValueError, match="salient fraction"):
        pbllm_bits(1.5)
    with pytest.raises(ValueError, match="0 < N ≤ M"):
        stbllm_bits(0.1, 6, 4)
